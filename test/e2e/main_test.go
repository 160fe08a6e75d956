//go:build e2e && linux

package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"
)

// clu is the one cluster all tests share (bring-up costs seconds, the tests run
// sequentially and each cleans up its pods).
var clu *cluster

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) (code int) {
	c, err := newCluster()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	var once sync.Once
	teardown := func() { once.Do(c.teardown) }
	defer teardown()
	defer func() {
		if r := recover(); r != nil {
			teardown()
			panic(r)
		}
	}()

	// Tear down on Ctrl-C / SIGTERM, and shortly before `go test -timeout` would
	// panic the binary (which skips deferred functions): a timed-out run must not
	// leave processes or mounts behind either.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		c.logf("got %v: tearing down", s)
		teardown()
		os.Exit(2)
	}()
	if f := flag.Lookup("test.timeout"); f != nil {
		if d, ok := f.Value.(flag.Getter).Get().(time.Duration); ok && d > time.Minute {
			time.AfterFunc(d-45*time.Second, func() {
				c.logf("test timeout (%v) nearly reached: tearing down", d)
				teardown()
				os.Exit(3)
			})
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	err = c.start(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: bring-up failed:", err)
		c.dumpLogTails()
		return 1
	}
	clu = c
	code = m.Run()
	if code != 0 {
		c.dumpLogTails()
	}
	c.printTimings()
	return code
}
