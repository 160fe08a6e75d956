//go:build fleet

package fleet

import (
	"bufio"
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// span is a time interval.
type span struct{ from, to time.Time }

func (s span) overlaps(o span) bool { return s.from.Before(o.to) && o.from.Before(s.to) }

// gctraceLine is the Go runtime's GODEBUG=gctrace=1 line: "gc N @S s P%:
// A+B+C ms clock, ...": the collection began S seconds after the process
// started; A (sweep termination, stop-the-world), B (the concurrent mark)
// and C (mark termination, stop-the-world) are its wall-clock phases.
var gctraceLine = regexp.MustCompile(`(?m)^gc \d+ @([\d.]+)s \d+%: ([\d.]+)\+([\d.]+)\+([\d.]+) ms clock`)

// gcMarks are the collections a process started at started logged with
// GODEBUG=gctrace=1 in log, each from its start to the end of its mark
// termination. The process's clock starts a little after started (exec):
// the spans are early by that (milliseconds), against marks of seconds.
func gcMarks(log []byte, started time.Time) []span {
	var out []span
	sc := bufio.NewScanner(bytes.NewReader(log))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		m := gctraceLine.FindSubmatch(sc.Bytes())
		if m == nil {
			continue
		}
		var f [4]float64
		for i := range f {
			f[i], _ = strconv.ParseFloat(string(m[i+1]), 64)
		}
		from := started.Add(time.Duration(f[0] * float64(time.Second)))
		out = append(out, span{from, from.Add(time.Duration((f[1] + f[2] + f[3]) * float64(time.Millisecond)))})
	}
	return out
}

// gcAgainst says how the API server's collections fell on a probe that ran
// over window and whose slow requests took the spans slow: how many
// collections overlapped it, what share of it their marks covered, and how
// many of the slow requests overlapped a mark. "" when marks is empty (no
// GODEBUG=gctrace=1).
func gcAgainst(marks []span, window span, slow []span) string {
	if len(marks) == 0 || !window.from.Before(window.to) {
		return ""
	}
	n, covered := 0, time.Duration(0)
	for _, m := range marks {
		if !m.overlaps(window) {
			continue
		}
		n++
		from, to := m.from, m.to
		if from.Before(window.from) {
			from = window.from
		}
		if to.After(window.to) {
			to = window.to
		}
		covered += to.Sub(from)
	}
	in := 0
	for _, r := range slow {
		for _, m := range marks {
			if r.overlaps(m) {
				in++
				break
			}
		}
	}
	plural := "s"
	if n == 1 {
		plural = ""
	}
	out := fmt.Sprintf("the API server's GC marked in %d collection%s, %.1f s (%.0f%%) of it", n, plural, covered.Seconds(), 100*covered.Seconds()/window.to.Sub(window.from).Seconds())
	if len(slow) > 0 {
		out += fmt.Sprintf(", %d of the %d requests over 100 ms within a mark", in, len(slow))
	}
	return out
}

// The gctrace lines of a process are its collections from its start; a
// probe's slow requests are counted within a mark when they overlap one.
func TestGCMarks(t *testing.T) {
	started := time.Date(2026, 12, 7, 22, 0, 0, 0, time.UTC)
	log := []byte(`I1207 22:00:00.010000   25525 options.go:261] external host was not specified
gc 1 @0.015s 2%: 0.010+1.5+0.020 ms clock, 0.021+0.1/1.2/0+0.041 ms cpu, 4->4->1 MB, 4 MB goal, 0 MB stacks, 0 MB globals, 2 P
W1207 22:00:05.000000   25525 a warning mentioning gc 7 @1s 1%: 1+1+1 ms clock
gc 2 @10.5s 1%: 0.49+2000+0.009 ms clock, 0.98+26/184/0+0.018 ms cpu, 2939->2964->1637 MB, 4043 MB goal, 0 MB stacks, 0 MB globals, 2 P
gc 3 @20s 1%: 500+1000+500 ms clock, 1+1/1/1+1 ms cpu, 1->1->1 MB, 2 MB goal, 0 MB stacks, 0 MB globals, 2 P (forced)
`)
	marks := gcMarks(log, started)
	want := []span{
		{started.Add(15 * time.Millisecond), started.Add(15*time.Millisecond + 1530*time.Microsecond)},
		{started.Add(10500 * time.Millisecond), started.Add(10500*time.Millisecond + 2000499*time.Microsecond)},
		{started.Add(20 * time.Second), started.Add(22 * time.Second)},
	}
	if len(marks) != len(want) {
		t.Fatalf("gcMarks: %d collections, want %d: %v", len(marks), len(want), marks)
	}
	for i := range want {
		if d := marks[i].from.Sub(want[i].from).Abs() + marks[i].to.Sub(want[i].to).Abs(); d > time.Microsecond {
			t.Errorf("collection %d: %v, want %v", i+1, marks[i], want[i])
		}
	}

	// A probe from +10 s to +21 s: marks of gc 2 (2.0005 s) and of gc 3
	// up to the probe's end (1 s); one slow request within gc 2's mark,
	// one between the two, one just after gc 3's mark began.
	at := func(s float64) time.Time { return started.Add(time.Duration(s * float64(time.Second))) }
	window := span{at(10), at(21)}
	slow := []span{{at(11), at(11.2)}, {at(15), at(15.3)}, {at(19.9), at(20.1)}}
	got := gcAgainst(marks, window, slow)
	if w := "the API server's GC marked in 2 collections, 3.0 s (27%) of it, 2 of the 3 requests over 100 ms within a mark"; got != w {
		t.Errorf("gcAgainst:\n got %s\nwant %s", got, w)
	}
	if got := gcAgainst(marks, span{at(19), at(21)}, nil); got != "the API server's GC marked in 1 collection, 1.0 s (50%) of it" {
		t.Errorf("gcAgainst of a window with one collection = %q", got)
	}
	if got := gcAgainst(nil, window, slow); got != "" {
		t.Errorf("gcAgainst without gctrace = %q, want nothing", got)
	}
	if got := gcAgainst(marks, span{at(3), at(9)}, nil); got != "the API server's GC marked in 0 collections, 0.0 s (0%) of it" {
		t.Errorf("gcAgainst of a window without collections = %q", got)
	}
}
