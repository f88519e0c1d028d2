// Command sbhelper runs inside test sandboxes: `sbhelper echo PORT` serves
// a TCP echo on 127.0.0.1:PORT; `sbhelper spew N` writes N bytes of a
// repeating pattern to stdout; `sbhelper udp HOST:PORT` sends one datagram
// and prints "sent" or the error.
package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: sbhelper echo PORT | spew N | udp HOST:PORT")
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
	default:
		os.Exit(2)
	}
}
