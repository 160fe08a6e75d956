package drivertest_test

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"

	"k8s.io/klog/v2/textlogger"

	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store/memstore"
)

// fakeOptions are options a driver runs with without root: the fake mounter,
// the in-memory store and a backend that provides nothing.
func fakeOptions() framework.Options {
	return framework.Options{
		Backends: map[string]framework.Backend{"none": framework.BackendFuncs{}},
		Mounter:  mount.NewFake(),
		Store:    memstore.New(),
	}
}

// logTB is the test it wraps, keeping what is logged through Log.
type logTB struct {
	testing.TB
	mu   sync.Mutex
	logs []string
}

func (l *logTB) Log(args ...any) {
	l.TB.Helper()
	l.mu.Lock()
	l.logs = append(l.logs, fmt.Sprint(args...))
	l.mu.Unlock()
	l.TB.Log(args...)
}

func (l *logTB) logged(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.logs {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}

func TestStartLogsToTheTest(t *testing.T) {
	tb := &logTB{TB: t}
	drivertest.Start(tb, fakeOptions())
	// Logged before the driver is ready, so before Start returns.
	if !tb.logged("Reconciled state") {
		t.Errorf("the driver's log did not reach t.Log: %q", tb.logs)
	}
}

func TestStartKeepsTheAuthorsLogger(t *testing.T) {
	var buf syncBuffer
	opts := fakeOptions()
	opts.Logger = textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&buf)))
	tb := &logTB{TB: t}
	drivertest.Start(tb, opts)
	if !strings.Contains(buf.String(), "Reconciled state") {
		t.Errorf("the author's logger got %q", buf.String())
	}
	if tb.logged("Reconciled state") {
		t.Error("the driver logged to t.Log although the author set a Logger")
	}
}

// A driver goroutine that logs after its test ended must not panic the test
// binary (testing.T.Log does, "Log in goroutine after ... has completed").
func TestStartLogAfterTheTestEnded(t *testing.T) {
	var h *drivertest.Harness
	t.Run("driver", func(t *testing.T) {
		h = drivertest.Start(t, fakeOptions())
	})
	h.Options.Logger.Info("Logged after the test ended")
	h.Options.Logger.Error(nil, "Logged after the test ended")
}

// syncBuffer is a bytes.Buffer safe for the driver's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
