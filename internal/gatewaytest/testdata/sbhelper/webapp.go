package main

import (
	"bufio"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// page is the web app's index: a script fills #status once it runs, so a
// browser test can tell a rendered page from a fetched one.
const page = `<!doctype html>
<html><head><title>sbhelper app</title></head>
<body><h1 id="title">sandbox app</h1><p id="status">static</p>
<script>document.getElementById("status").textContent = "rendered by " + location.host;</script>
</body></html>
`

// serveWebApp serves the test web app: / (the page), /headers (the Host,
// whether an Authorization header arrived, and the Cookie header),
// /stream (five chunks, one every 100 ms, flushed) and /ws (a WebSocket echo of text frames).
func serveWebApp(addr string) {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, page)
	})
	mux.HandleFunc("/headers", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "host=%s authorization=%t cookie=%q\n", r.Host, r.Header.Get("Authorization") != "", r.Header.Get("Cookie"))
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		for i := range 5 {
			fmt.Fprintf(w, "chunk %d\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond)
		}
	})
	mux.HandleFunc("/ws", wsEcho)
	if err := http.ListenAndServe(addr, mux); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// wsEcho answers a WebSocket handshake and echoes text frames until the
// client closes (RFC 6455, unfragmented frames only).
func wsEcho(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Sec-WebSocket-Key")
	if r.Header.Get("Upgrade") != "websocket" || key == "" {
		http.Error(w, "websocket only", http.StatusBadRequest)
		return
	}
	c, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	sum := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n", base64.StdEncoding.EncodeToString(sum[:]))
	rw.Flush()
	for {
		op, payload, err := readFrame(rw.Reader)
		if err != nil || op == 8 {
			return
		}
		writeFrame(rw.Writer, op, payload)
		rw.Flush()
	}
}

func readFrame(r *bufio.Reader) (byte, []byte, error) {
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return 0, nil, err
		}
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(b[:])
	}
	var mask [4]byte
	masked := h[1]&0x80 != 0
	if masked {
		if _, err := io.ReadFull(r, mask[:]); err != nil {
			return 0, nil, err
		}
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, err
	}
	if masked {
		for i := range p {
			p[i] ^= mask[i%4]
		}
	}
	return h[0] & 0x0f, p, nil
}

func writeFrame(w *bufio.Writer, op byte, p []byte) {
	w.WriteByte(0x80 | op)
	switch {
	case len(p) < 126:
		w.WriteByte(byte(len(p)))
	case len(p) < 1<<16:
		w.WriteByte(126)
		binary.Write(w, binary.BigEndian, uint16(len(p)))
	default:
		w.WriteByte(127)
		binary.Write(w, binary.BigEndian, uint64(len(p)))
	}
	w.Write(p)
}
