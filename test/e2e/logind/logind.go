// Package logind plays systemd-logind's part in a graceful node shutdown, for the
// e2e tests of a kubelet on a machine whose PID 1 is not systemd: on a private
// D-Bus system bus (a dbus-daemon with BusConfig), it owns org.freedesktop.login1
// and serves what the kubelet's node shutdown manager uses
// (k8s.io/kubernetes pkg/kubelet/nodeshutdown/systemd):
//
//   - the property InhibitDelayMaxUSec of org.freedesktop.login1.Manager (read
//     through org.freedesktop.DBus.Properties.Get), which the kubelet compares
//     with the grace periods it is configured with: below their sum it writes
//     /etc/systemd/logind.conf.d/99-kubelet.conf on the host and asks systemd to
//     reload logind, so a test must give at least that sum (Options);
//   - Manager.Inhibit(what, who, why, mode), which answers with a real file
//     descriptor, the write end of a pipe whose read end the stand-in keeps: the
//     lock is held until every copy of that descriptor is closed, as logind's
//     inhibitor FIFOs are;
//   - the signal Manager.PrepareForShutdown(bool), sent by Shutdown (true) and
//     Cancel (false).
//
// Shutdown does what logind does before it powers the machine off: it announces
// the shutdown and waits until every delay lock on "shutdown" is released, or
// until InhibitDelayMax has passed. Nothing is powered off; what a test does next
// (a cancel, a kubelet restart, a simulated power cycle) is the test's.
//
// Nothing else of logind is there (sessions, seats, block locks holding anything
// up, PowerOff): a caller of another method gets org.freedesktop.DBus.Error.UnknownMethod.
package logind

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/godbus/dbus/v5"
)

// The names logind serves under, as the kubelet calls them.
const (
	Service          = "org.freedesktop.login1"
	ObjectPath       = dbus.ObjectPath("/org/freedesktop/login1")
	ManagerInterface = "org.freedesktop.login1.Manager"
	propertiesIface  = "org.freedesktop.DBus.Properties"
)

// Address is the D-Bus address of a bus listening on the unix socket path: what
// DBUS_SYSTEM_BUS_ADDRESS must say for a client (godbus, which the kubelet uses,
// honours it) to take that bus for the system bus.
func Address(socket string) string { return "unix:path=" + socket }

// BusConfig is a dbus-daemon configuration (dbus-daemon --config-file) for a
// private bus of type system listening on the unix socket path socket: EXTERNAL
// authentication (peer credentials; file descriptors can be passed), every
// connection may own any name and send to any destination. It drops no
// privileges and starts no services.
func BusConfig(socket string) string {
	return `<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>` + Address(socket) + `</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
`
}

// Options configure the stand-in.
type Options struct {
	// InhibitDelayMax is logind's InhibitDelayMaxSec: how long Shutdown waits for
	// delay locks. Defaults to 5s, logind's default (the kubelet then rewrites
	// logind's configuration on the host when its grace periods add up to more:
	// set at least their sum).
	InhibitDelayMax time.Duration
}

// Inhibitor is one lock taken with Inhibit.
type Inhibitor struct {
	What, Who, Why, Mode string
	// Sender is the caller's unique bus name.
	Sender string
	// Taken is when the lock was handed out; Released when the last copy of its
	// descriptor was closed (zero while held).
	Taken, Released time.Time
}

// Held reports whether the lock is still held.
func (i Inhibitor) Held() bool { return i.Released.IsZero() }

// delays reports whether the lock delays a shutdown.
func (i Inhibitor) delays() bool {
	return i.Mode == "delay" && slices.Contains(strings.Split(i.What, ":"), "shutdown")
}

// Logind is the stand-in, connected to a bus.
type Logind struct {
	conn  *dbus.Conn
	delay time.Duration

	serial atomic.Uint32

	mu         sync.Mutex
	inhibitors []*Inhibitor
	// unsent holds the write ends of the pipes handed out in replies not yet
	// written, by reply serial: closed once the reply is on the wire (see
	// outgoing), the caller's copy is then the only one.
	unsent  map[uint32]*os.File
	replies map[*os.File]bool // write ends returned by Inhibit, not yet in a reply
	changed chan struct{}     // closed and replaced on every change
	closed  bool
}

// Start connects to the bus at address, serves org.freedesktop.login1 there and
// returns once the name is owned. Close disconnects.
func Start(address string, opts Options) (*Logind, error) {
	if opts.InhibitDelayMax == 0 {
		opts.InhibitDelayMax = 5 * time.Second
	}
	if opts.InhibitDelayMax < 0 {
		return nil, fmt.Errorf("logind: InhibitDelayMax %v is negative", opts.InhibitDelayMax)
	}
	l := &Logind{
		delay:   opts.InhibitDelayMax,
		unsent:  map[uint32]*os.File{},
		replies: map[*os.File]bool{},
		changed: make(chan struct{}),
	}
	conn, err := dbus.Connect(address, dbus.WithSerialGenerator(l), dbus.WithOutgoingInterceptor(l.outgoing))
	if err != nil {
		return nil, fmt.Errorf("logind: connect to %s: %w", address, err)
	}
	l.conn = conn
	if err := conn.Export(manager{l}, ObjectPath, ManagerInterface); err != nil {
		conn.Close()
		return nil, err
	}
	if err := conn.Export(properties{l}, ObjectPath, propertiesIface); err != nil {
		conn.Close()
		return nil, err
	}
	reply, err := conn.RequestName(Service, dbus.NameFlagDoNotQueue)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("logind: request name %s: %w", Service, err)
	}
	if reply != dbus.RequestNameReplyPrimaryOwner {
		conn.Close()
		return nil, fmt.Errorf("logind: name %s is taken on %s (reply %v)", Service, address, reply)
	}
	return l, nil
}

// Close releases the name and disconnects. Locks still held stay held by their
// holders' descriptors; the stand-in no longer watches them.
func (l *Logind) Close() error {
	l.mu.Lock()
	l.closed = true
	for s, w := range l.unsent {
		w.Close()
		delete(l.unsent, s)
	}
	for w := range l.replies {
		w.Close()
		delete(l.replies, w)
	}
	l.mu.Unlock()
	return l.conn.Close()
}

// GetSerial and RetireSerial make the stand-in the connection's serial
// generator (dbus.WithSerialGenerator): godbus retires a reply's serial right
// after writing it, which is when the pipe's write end in it can be closed.
func (l *Logind) GetSerial() uint32 {
	for {
		if s := l.serial.Add(1); s != 0 {
			return s
		}
	}
}

// RetireSerial closes the write end a reply carried, once that reply is written.
func (l *Logind) RetireSerial(serial uint32) {
	l.mu.Lock()
	w := l.unsent[serial]
	delete(l.unsent, serial)
	l.mu.Unlock()
	if w != nil {
		w.Close()
	}
}

// outgoing notes which reply carries which write end (the serial is set before
// the interceptor runs).
func (l *Logind) outgoing(msg *dbus.Message) {
	if msg.Type != dbus.TypeMethodReply {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, v := range msg.Body {
		fd, ok := v.(dbus.UnixFD)
		if !ok {
			continue
		}
		for w := range l.replies {
			if int(w.Fd()) == int(fd) {
				delete(l.replies, w)
				l.unsent[msg.Serial()] = w
			}
		}
	}
}

// Inhibitors returns every lock taken so far, in the order they were taken.
func (l *Logind) Inhibitors() []Inhibitor {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Inhibitor, len(l.inhibitors))
	for i, x := range l.inhibitors {
		out[i] = *x
	}
	return out
}

// WaitInhibitor waits until a delay lock on "shutdown" held by who is taken
// after since, and returns it.
func (l *Logind) WaitInhibitor(ctx context.Context, who string, since time.Time) (Inhibitor, error) {
	for {
		l.mu.Lock()
		ch := l.changed
		for _, x := range l.inhibitors {
			if x.Who == who && x.delays() && x.Held() && !x.Taken.Before(since) {
				l.mu.Unlock()
				return *x, nil
			}
		}
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return Inhibitor{}, fmt.Errorf("logind: no delay lock on shutdown by %q since %s: %w", who, since.Format(time.RFC3339Nano), ctx.Err())
		}
	}
}

// Result is what Shutdown saw.
type Result struct {
	// Announced is when PrepareForShutdown(true) was sent; Done when the last
	// delay lock was released, or when InhibitDelayMax ran out.
	Announced, Done time.Time
	// Waited are the delay locks on shutdown held at the announcement, as they
	// were when Shutdown returned.
	Waited []Inhibitor
	// TimedOut: InhibitDelayMax passed with locks still held (logind would power
	// off anyway).
	TimedOut bool
}

// ErrNoDelayLock is Shutdown's error when nothing holds a delay lock on
// shutdown: the announcement is sent, but nobody asked to be waited for.
var ErrNoDelayLock = errors.New("logind: no delay lock on shutdown is held")

// Shutdown announces a shutdown (PrepareForShutdown(true)) and waits until every
// delay lock on shutdown held at that moment is released, at most
// InhibitDelayMax (the result says TimedOut) or until ctx ends.
func (l *Logind) Shutdown(ctx context.Context) (Result, error) {
	l.mu.Lock()
	var waited []*Inhibitor
	for _, x := range l.inhibitors {
		if x.delays() && x.Held() {
			waited = append(waited, x)
		}
	}
	l.mu.Unlock()
	res := Result{Announced: time.Now()}
	if err := l.conn.Emit(ObjectPath, ManagerInterface+".PrepareForShutdown", true); err != nil {
		return res, fmt.Errorf("logind: emit PrepareForShutdown(true): %w", err)
	}
	snapshot := func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		res.Waited = res.Waited[:0]
		for _, x := range waited {
			res.Waited = append(res.Waited, *x)
		}
	}
	if len(waited) == 0 {
		res.Done = res.Announced
		return res, ErrNoDelayLock
	}
	timer := time.NewTimer(l.delay)
	defer timer.Stop()
	for {
		l.mu.Lock()
		ch, held := l.changed, 0
		for _, x := range waited {
			if x.Held() {
				held++
			}
		}
		l.mu.Unlock()
		if held == 0 {
			snapshot()
			for _, x := range res.Waited {
				if x.Released.After(res.Done) {
					res.Done = x.Released
				}
			}
			return res, nil
		}
		select {
		case <-ch:
		case <-timer.C:
			snapshot()
			res.Done, res.TimedOut = time.Now(), true
			return res, nil
		case <-ctx.Done():
			snapshot()
			res.Done = time.Now()
			return res, fmt.Errorf("logind: waiting for %d delay locks: %w", held, ctx.Err())
		}
	}
}

// Cancel announces that the shutdown is off (PrepareForShutdown(false)); the
// kubelet then takes its delay lock again.
func (l *Logind) Cancel() error {
	if err := l.conn.Emit(ObjectPath, ManagerInterface+".PrepareForShutdown", false); err != nil {
		return fmt.Errorf("logind: emit PrepareForShutdown(false): %w", err)
	}
	return nil
}

func (l *Logind) notify() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// inhibit hands out a lock: the write end of a new pipe, whose read end is
// watched until every copy of the write end is closed.
func (l *Logind) inhibit(sender, what, who, why, mode string) (dbus.UnixFD, *dbus.Error) {
	if what == "" || who == "" || why == "" {
		return 0, dbus.NewError("org.freedesktop.DBus.Error.InvalidArgs", []any{"what, who and why must be set"})
	}
	for _, w := range strings.Split(what, ":") {
		switch w {
		case "shutdown", "sleep", "idle", "handle-power-key", "handle-suspend-key", "handle-hibernate-key", "handle-lid-switch", "handle-reboot-key":
		default:
			return 0, dbus.NewError("org.freedesktop.DBus.Error.InvalidArgs", []any{fmt.Sprintf("invalid what specification %q", what)})
		}
	}
	if mode != "delay" && mode != "block" {
		return 0, dbus.NewError("org.freedesktop.DBus.Error.InvalidArgs", []any{fmt.Sprintf("invalid mode specification %q", mode)})
	}
	r, w, err := os.Pipe()
	if err != nil {
		return 0, dbus.MakeFailedError(err)
	}
	x := &Inhibitor{What: what, Who: who, Why: why, Mode: mode, Sender: sender, Taken: time.Now()}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		r.Close()
		w.Close()
		return 0, dbus.MakeFailedError(errors.New("logind: closed"))
	}
	l.inhibitors = append(l.inhibitors, x)
	l.replies[w] = true
	l.notify()
	l.mu.Unlock()
	go func() {
		// EOF once the holder (and everyone it passed the descriptor to) has
		// closed it: the lock is released.
		_, _ = io.Copy(io.Discard, r)
		r.Close()
		l.mu.Lock()
		x.Released = time.Now()
		l.notify()
		l.mu.Unlock()
	}()
	return dbus.UnixFD(w.Fd()), nil
}

// manager is org.freedesktop.login1.Manager: the methods exported on the bus.
type manager struct{ l *Logind }

// Inhibit is logind's Inhibit(s what, s who, s why, s mode) -> (h fd).
func (m manager) Inhibit(sender dbus.Sender, what, who, why, mode string) (dbus.UnixFD, *dbus.Error) {
	return m.l.inhibit(string(sender), what, who, why, mode)
}

// properties is org.freedesktop.DBus.Properties of logind's object, with the
// one property the kubelet reads.
type properties struct{ l *Logind }

func (p properties) Get(iface, name string) (dbus.Variant, *dbus.Error) {
	all, err := p.GetAll(iface)
	if err != nil {
		return dbus.Variant{}, err
	}
	v, ok := all[name]
	if !ok {
		return dbus.Variant{}, dbus.NewError("org.freedesktop.DBus.Error.UnknownProperty", []any{fmt.Sprintf("no property %s.%s", iface, name)})
	}
	return v, nil
}

func (p properties) GetAll(iface string) (map[string]dbus.Variant, *dbus.Error) {
	if iface != ManagerInterface {
		return nil, dbus.NewError("org.freedesktop.DBus.Error.UnknownInterface", []any{fmt.Sprintf("no interface %s", iface)})
	}
	return map[string]dbus.Variant{
		"InhibitDelayMaxUSec": dbus.MakeVariant(uint64(p.l.delay / time.Microsecond)),
	}, nil
}

func (p properties) Set(iface, name string, _ dbus.Variant) *dbus.Error {
	return dbus.NewError("org.freedesktop.DBus.Error.PropertyReadOnly", []any{fmt.Sprintf("property %s.%s is read-only", iface, name)})
}
