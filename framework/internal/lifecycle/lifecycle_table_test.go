package lifecycle

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/framework/store"
)

var updateLifecycleDoc = flag.Bool("update-lifecycle-doc", false, "rewrite the table of docs/design.md's Lifecycle section from framework/internal/lifecycle/lifecycle.go")

// impossible are the state × event pairs that cannot happen: a publish is
// the event of a volume without a record, a republish that of one with a
// record, and the GC acts on records that name a pod.
var impossible = map[volState][]event{
	stateNone:         {evRepublish, evGC},
	statePublishing:   {evPublish},
	statePublished:    {evPublish},
	stateUnpublishing: {evPublish},
	stateRebuilt:      {evPublish},
	stateUnclaimed:    {evPublish, evGC},
}

// TestLifecycleTable checks that the table is a function: each state, event
// and case has one row with an action, and every state has rows for every
// event that can happen in it (a new state must say what each event does).
func TestLifecycleTable(t *testing.T) {
	type key struct {
		s  volState
		e  event
		on cond
	}
	rows := map[key]int{}
	covered := map[volState]map[event]bool{}
	for i, tr := range transitions {
		if tr.run == nil || tr.Do == "" || tr.To == "" || len(tr.From) == 0 {
			t.Errorf("row %d (%s): needs From, run, Do and To", i, tr.On)
		}
		if !slices.Contains(allEvents, tr.On) {
			t.Errorf("row %d: unknown event %q", i, tr.On)
		}
		for _, s := range tr.From {
			if !slices.Contains(volStates, s) {
				t.Errorf("row %d: unknown state %q", i, s)
			}
			k := key{s, tr.On, tr.When}
			if j, dup := rows[k]; dup {
				t.Errorf("rows %d and %d both handle %s in state %s (%q)", j, i, tr.On, s, tr.When)
			}
			rows[k] = i
			if covered[s] == nil {
				covered[s] = map[event]bool{}
			}
			covered[s][tr.On] = true
		}
	}
	for _, s := range volStates {
		for _, e := range allEvents {
			never := slices.Contains(impossible[s], e)
			switch {
			case covered[s][e] && never:
				t.Errorf("state %s has a row for %s, which cannot happen in it", s, e)
			case !covered[s][e] && !never:
				t.Errorf("state %s has no row for %s", s, e)
			}
		}
	}
}

// TestLifecycleRecordStates checks stateOf against every phase a record has.
func TestLifecycleRecordStates(t *testing.T) {
	for _, tc := range []struct {
		rec  *store.Record
		want volState
	}{
		{nil, stateNone},
		{&store.Record{Phase: store.PhasePublishing}, statePublishing},
		{&store.Record{Phase: store.PhasePublished}, statePublished},
		{&store.Record{Phase: store.PhaseUnpublishing}, stateUnpublishing},
		{&store.Record{Phase: store.PhasePublished, Rebuilt: true}, stateRebuilt},
		{&store.Record{Phase: store.PhaseUnclaimed, Rebuilt: true}, stateUnclaimed},
		{&store.Record{Phase: store.PhaseUnclaimed}, stateUnclaimed},
		{&store.Record{Phase: "SomethingNewer"}, statePublishing},
	} {
		if got := stateOf(tc.rec); got != tc.want {
			t.Errorf("stateOf(%+v) = %s, want %s", tc.rec, got, tc.want)
		}
	}
}

// renderLifecycleTable is the markdown of the transition table.
func renderLifecycleTable() string {
	var b strings.Builder
	b.WriteString("| State | Event | When | Does | Then |\n|---|---|---|---|---|\n")
	for _, tr := range transitions {
		from := make([]string, len(tr.From))
		for i, s := range tr.From {
			from[i] = string(s)
		}
		when := string(tr.When)
		if when == "" {
			when = "—"
		}
		b.WriteString("| " + strings.Join(from, ", ") + " | " + string(tr.On) + " | " + when + " | " + tr.Do + " | " + tr.To + " |\n")
	}
	return b.String()
}

const (
	lifecycleBegin = "<!-- lifecycle table: generated from framework/internal/lifecycle/lifecycle.go by TestLifecycleDoc; go test ./framework/internal/lifecycle/ -run TestLifecycleDoc -update-lifecycle-doc -->\n"
	lifecycleEnd   = "<!-- end of lifecycle table -->"
)

// TestLifecycleDoc fails when the table in docs/design.md's Lifecycle
// section is not the one lifecycle.go runs.
func TestLifecycleDoc(t *testing.T) {
	path := filepath.Join("..", "..", "..", "docs", "design.md")
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(doc), lifecycleBegin)
	j := strings.Index(string(doc), lifecycleEnd)
	if i < 0 || j < i {
		t.Fatalf("%s has no lifecycle table between %q and %q", path, strings.TrimSpace(lifecycleBegin), lifecycleEnd)
	}
	got, want := string(doc[i+len(lifecycleBegin):j]), renderLifecycleTable()
	if got == want {
		return
	}
	if *updateLifecycleDoc {
		out := slices.Concat(doc[:i+len(lifecycleBegin)], []byte(want), doc[j:])
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("the lifecycle table of %s differs from framework/internal/lifecycle/lifecycle.go; run go test ./framework/internal/lifecycle/ -run TestLifecycleDoc -update-lifecycle-doc\ngot:\n%s\nwant:\n%s", path, got, want)
}
