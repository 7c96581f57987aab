// Command spdyinterop is the Go side of tests/unit/vkprovider/spdy/test_session.py's interop tests: a
// github.com/moby/spdystream peer (what Kubernetes speaks) over a loopback TCP socket.
//
//	spdyinterop server           listen on 127.0.0.1, print "LISTEN <port>", serve one connection
//	spdyinterop client <port> <n> connect, run the client scenario with n-byte echoes
//
// Server streams act on their "x-test" header: "echo" replies (x-got-streamtype = the
// streamtype header) and echoes until FIN, then sends FIN; "reset" replies, reads one byte and
// resets; "refuse" refuses. Each line on stdout is a fact the Python test checks.
package main

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/moby/spdystream"
)

func fail(format string, args ...any) {
	fmt.Printf("FAIL "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	if len(os.Args) < 2 {
		fail("usage: spdyinterop server | client <port> <bytes>")
	}
	switch os.Args[1] {
	case "server":
		server()
	case "client":
		port, _ := strconv.Atoi(os.Args[2])
		n, _ := strconv.Atoi(os.Args[3])
		client(port, n)
	default:
		fail("unknown mode %q", os.Args[1])
	}
}

func server() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail("listen: %v", err)
	}
	fmt.Printf("LISTEN %d\n", ln.Addr().(*net.TCPAddr).Port)
	nc, err := ln.Accept()
	if err != nil {
		fail("accept: %v", err)
	}
	conn, err := spdystream.NewConnection(nc, true)
	if err != nil {
		fail("spdy: %v", err)
	}
	var once sync.Once
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	conn.Serve(func(s *spdystream.Stream) {
		h := s.Headers()
		say("STREAM %d x-test=%s streamtype=%s", s.Identifier(), h.Get("x-test"), h.Get("streamtype"))
		once.Do(func() {
			go func() {
				if _, err := conn.Ping(); err != nil {
					say("PING failed %v", err)
				} else {
					say("PING ok")
				}
			}()
		})
		switch h.Get("x-test") {
		case "echo":
			if err := s.SendReply(http.Header{"X-Got-Streamtype": {h.Get("streamtype")}}, false); err != nil {
				say("FAIL reply %v", err)
				return
			}
			go func() {
				n, err := io.Copy(s, s)
				say("ECHOED %d %d err=%v", s.Identifier(), n, err)
				s.Close()
			}()
		case "reset":
			s.SendReply(http.Header{}, false)
			go func() {
				buf := make([]byte, 1)
				s.Read(buf)
				s.Reset()
				say("RESET %d", s.Identifier())
			}()
		default:
			s.Refuse()
		}
	})
	say("DONE")
}

func client(port, n int) {
	nc, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		fail("dial: %v", err)
	}
	conn, err := spdystream.NewConnection(nc, false)
	if err != nil {
		fail("spdy: %v", err)
	}
	go conn.Serve(spdystream.NoOpStreamHandler)

	if _, err := conn.Ping(); err != nil {
		fail("ping: %v", err)
	}
	fmt.Println("PING ok")

	var wg sync.WaitGroup
	errs := make(chan string, 16)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if msg := echo(conn, i, n); msg != "" {
				errs <- msg
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for msg := range errs {
		fail("%s", msg)
	}
	fmt.Println("ECHO ok")

	s, err := conn.CreateStream(http.Header{"X-Test": {"refuse"}}, nil, false)
	if err != nil {
		fail("create: %v", err)
	}
	if err := s.WaitTimeout(10 * time.Second); err != spdystream.ErrReset {
		fail("refused stream: want ErrReset, got %v", err)
	}
	fmt.Println("REFUSED ok")

	// The Python side resets this one after reading its first byte.
	s, err = conn.CreateStream(http.Header{"X-Test": {"reset"}}, nil, false)
	if err != nil {
		fail("create: %v", err)
	}
	if err := s.WaitTimeout(10 * time.Second); err != nil {
		fail("reset stream reply: %v", err)
	}
	s.Write([]byte("x"))
	if _, err := io.ReadAll(s); err != nil {
		fail("reset stream read: %v", err)
	}
	if !s.IsFinished() {
		fail("reset stream not finished")
	}
	fmt.Println("RESET ok")

	if err := conn.CloseWait(); err != nil {
		fail("close: %v", err)
	}
	fmt.Println("DONE")
}

func echo(conn *spdystream.Connection, i, n int) string {
	h := http.Header{"X-Test": {"echo"}, "Streamtype": {fmt.Sprintf("data-%d", i)}}
	s, err := conn.CreateStream(h, nil, false)
	if err != nil {
		return fmt.Sprintf("create: %v", err)
	}
	if err := s.WaitTimeout(10 * time.Second); err != nil {
		return fmt.Sprintf("stream %d reply: %v", i, err)
	}
	// spdystream drops SYN_REPLY headers (connection.go handleReplyFrame), so ours are only
	// checked for parsing: a broken header block would end its read loop.
	payload := make([]byte, n)
	rand.New(rand.NewSource(int64(i))).Read(payload)
	go func() {
		for off := 0; off < n; off += 40000 { // odd-sized writes: frames straddle windows
			end := min(off+40000, n)
			if _, err := s.Write(payload[off:end]); err != nil {
				return
			}
		}
		s.Close()
	}()
	got, err := io.ReadAll(s)
	if err != nil {
		return fmt.Sprintf("stream %d read: %v", i, err)
	}
	if !bytes.Equal(got, payload) {
		return fmt.Sprintf("stream %d: echoed %d bytes (sha %x), sent %d (sha %x)", i, len(got), sha256.Sum256(got), n, sha256.Sum256(payload))
	}
	return ""
}
