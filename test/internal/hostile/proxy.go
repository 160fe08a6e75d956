package hostile

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// proxy forwards the driver's connections on public to the plugin's socket
// inner, shaping what the plugin sends back: at rate bytes per second for
// the whole of each connection (Trickle), or until CrashAfterBytes of it
// were sent once crashing is set, when the process dies (Crash).
type proxy struct {
	public, inner string
	rate          int64        // bytes per second; 0: as fast as they come
	crashing      *atomic.Bool // set by a Crash answer; nil: never
	sent          atomic.Int64 // bytes sent since crashing was set
}

// serve accepts connections until ctx ends, then closes them.
func (p *proxy) serve(ctx context.Context) error {
	_ = os.Remove(p.public) // a socket left by a process that crashed
	ln, err := net.Listen("unix", p.public)
	if err != nil {
		return err
	}
	var (
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
		wg    sync.WaitGroup
	)
	stop := context.AfterFunc(ctx, func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	defer stop()
	for {
		c, err := ln.Accept()
		if err != nil {
			wg.Wait()
			_ = os.Remove(p.public)
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		mu.Lock()
		conns[c] = true
		mu.Unlock()
		wg.Go(func() {
			p.forward(c)
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
		})
	}
}

// forward connects c to the plugin and copies both ways until either side
// ends.
func (p *proxy) forward(c net.Conn) {
	defer c.Close()
	in, err := net.Dial("unix", p.inner)
	if err != nil {
		return
	}
	defer in.Close()
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(in, c) // the driver's requests, as they come
		done <- struct{}{}
	}()
	go func() {
		_ = p.shape(c, in)
		done <- struct{}{}
	}()
	<-done // either side gone: close both, which ends the other copy
	c.Close()
	in.Close()
	<-done
}

// shape copies the plugin's bytes from src to dst, throttled or crashing.
func (p *proxy) shape(dst io.Writer, src io.Reader) error {
	buf := make([]byte, 4<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if p.crashing != nil && p.crashing.Load() && p.sent.Add(int64(n)) >= CrashAfterBytes {
				_, _ = dst.Write(chunk[:n/2])
				os.Exit(3) // mid-answer: the driver got part of it
			}
			if _, werr := dst.Write(chunk); werr != nil {
				return werr
			}
			if p.rate > 0 {
				time.Sleep(time.Duration(int64(n) * int64(time.Second) / p.rate))
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}
