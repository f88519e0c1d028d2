// Command sbhelper runs inside test sandboxes: `sbhelper echo PORT` serves
// a TCP echo on 127.0.0.1:PORT; `sbhelper spew N` writes N bytes of a
// repeating pattern to stdout; `sbhelper udp HOST:PORT` sends one datagram
// and prints "sent" or the error; `sbhelper get URL` fetches URL through
// the HTTP_PROXY of its environment and prints the body; `sbhelper http
// PORT` serves a small web app on 127.0.0.1:PORT (webapp.go).
package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: sbhelper echo PORT | spew N | udp HOST:PORT | get URL")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "echo":
		ln, err := net.Listen("tcp", "127.0.0.1:"+os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for {
			c, err := ln.Accept()
			if err != nil {
				os.Exit(1)
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	case "spew":
		n, _ := strconv.Atoi(os.Args[2])
		w := bufio.NewWriterSize(os.Stdout, 64<<10)
		pattern := []byte("0123456789abcdef")
		for i := 0; i < n; i++ {
			w.WriteByte(pattern[i%len(pattern)])
		}
		w.Flush()
	case "udp":
		c, err := net.Dial("udp", os.Args[2])
		if err == nil {
			_, err = c.Write([]byte("x"))
		}
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("sent")
	case "http":
		serveWebApp("127.0.0.1:" + os.Args[2])
	case "get":
		cl := &http.Client{Timeout: 10 * time.Second}
		resp, err := cl.Get(os.Args[2])
		if err == nil {
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %s", resp.Status)
			} else {
				_, err = io.Copy(os.Stdout, resp.Body)
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	default:
		os.Exit(2)
	}
}
