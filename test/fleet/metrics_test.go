//go:build fleet

package fleet

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// snapshot is one scrape of the API server: series (name{labels}) to value,
// with its CPU seconds and time.
type snapshot struct {
	series    map[string]float64
	cpu       float64
	rss, peak float64 // kube-apiserver's VmRSS and VmHWM
	fds       float64 // kube-apiserver's open descriptors
	selfRSS   float64 // the simulating process's VmRSS
	selfCPU   float64 // the simulating process's CPU seconds
	busy, all float64 // the machine's busy and total CPU seconds
	at        time.Time
}

func parseMetrics(text string) map[string]float64 {
	m := map[string]float64{}
	for _, l := range strings.Split(text, "\n") {
		if l == "" || l[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err != nil {
			continue
		}
		m[l[:i]] = v
	}
	return m
}

// sum adds the series of metric name whose labels contain every one of subs.
func (s snapshot) sum(name string, subs ...string) float64 {
	var t float64
outer:
	for k, v := range s.series {
		n, labels, _ := strings.Cut(k, "{")
		if n != name {
			continue
		}
		for _, sub := range subs {
			if !strings.Contains(labels, sub) {
				continue outer
			}
		}
		t += v
	}
	return t
}

// phaseResult is what one phase cost the API server.
type phaseResult struct {
	name     string
	nodes    int
	duration time.Duration
	values   map[string]float64
	byVerb   map[string]float64 // "VERB resource code" -> requests
	latency  string             // the kube-system client's, if measured
	note     string
	classes  []classResult // per flow schema and priority level
	occ      string        // the priority levels' occupancy, sampled through the phase
}

// classResult is what priority and fairness did with one request class (a
// flow schema and its priority level) in a phase.
type classResult struct {
	pl, fs               string
	dispatched, rejected float64
	waitSum, waitN       float64
	waitP99, waitMax     float64 // upper bounds of the wait histogram's buckets
	seatsSum, seatsN     float64
	execSum, execN       float64 // request execution seconds
	rejectedBy           map[string]float64
}

func (c classResult) waitMean() float64 {
	if c.waitN == 0 {
		return 0
	}
	return c.waitSum / c.waitN
}

// measured are the report's columns: name, how to compute from before and
// after.
var measured = []struct {
	name  string
	delta bool // a counter (after - before); false: a gauge (after)
	get   func(s snapshot) float64
}{
	{"requests", true, func(s snapshot) float64 { return s.sum("apiserver_request_total") }},
	{"APF flow ephemera-scratch-node", true, func(s snapshot) float64 {
		return s.sum("apiserver_flowcontrol_dispatched_requests_total", `flow_schema="ephemera-scratch-node"`)
	}},
	{"APF flow kube-system-service-accounts", true, func(s snapshot) float64 {
		return s.sum("apiserver_flowcontrol_dispatched_requests_total", `flow_schema="kube-system-service-accounts"`)
	}},
	{"APF flow system-nodes", true, func(s snapshot) float64 {
		return s.sum("apiserver_flowcontrol_dispatched_requests_total", `flow_schema="system-nodes"`)
	}},
	{"pod watches open", false, func(s snapshot) float64 {
		return s.sum("apiserver_longrunning_requests", `resource="pods"`, `verb="WATCH"`)
	}},
	{"pod watch events", true, func(s snapshot) float64 { return s.sum("apiserver_watch_events_total", `resource="pods"`) }},
	{"pod watch event bytes", true, func(s snapshot) float64 { return s.sum("apiserver_watch_events_sizes_sum", `resource="pods"`) }},
	{"pod init events", true, func(s snapshot) float64 { return s.sum("apiserver_init_events_total", `resource="pods"`) }},
	{"pod lists from the watch cache", true, func(s snapshot) float64 { return s.sum("apiserver_storage_list_total", `resource="pods"`) }},
	{"  of them by the spec.nodeName index", true, func(s snapshot) float64 {
		return s.sum("apiserver_storage_list_total", `resource="pods"`, `index="f:spec.nodeName"`)
	}},
	{"pod list objects fetched", true, func(s snapshot) float64 {
		return s.sum("apiserver_storage_list_fetched_objects_total", `resource="pods"`)
	}},
	{"pod list objects returned", true, func(s snapshot) float64 {
		return s.sum("apiserver_storage_list_returned_objects_total", `resource="pods"`)
	}},
	{"APF rejected", true, func(s snapshot) float64 { return s.sum("apiserver_flowcontrol_rejected_requests_total") }},
	{"APF wait seconds", true, func(s snapshot) float64 { return s.sum("apiserver_flowcontrol_request_wait_duration_seconds_sum") }},
	{"APF seats", true, func(s snapshot) float64 { return s.sum("apiserver_flowcontrol_work_estimated_seats_sum") }},
	{"CPU seconds", true, func(s snapshot) float64 { return s.cpu }},
	{"simulation CPU seconds", true, func(s snapshot) float64 { return s.selfCPU }},
	{"machine CPU busy seconds (every process)", true, func(s snapshot) float64 { return s.busy }},
	{"machine CPU seconds (busy and idle)", true, func(s snapshot) float64 { return s.all }},
	{"API server RSS bytes", false, func(s snapshot) float64 { return s.rss }},
	{"API server peak RSS bytes", false, func(s snapshot) float64 { return s.peak }},
	{"API server open fds", false, func(s snapshot) float64 { return s.fds }},
	{"simulation RSS bytes", false, func(s snapshot) float64 { return s.selfRSS }},
	{"allocated bytes", true, func(s snapshot) float64 {
		if v := s.sum("go_memstats_alloc_bytes_total"); v > 0 {
			return v
		}
		return s.sum("go_gc_heap_allocs_bytes_total")
	}},
}

func diff(name string, nodes int, before, after snapshot) phaseResult {
	r := phaseResult{name: name, nodes: nodes, duration: after.at.Sub(before.at), values: map[string]float64{}, byVerb: map[string]float64{}}
	for _, m := range measured {
		v := m.get(after)
		if m.delta {
			v -= m.get(before)
		}
		r.values[m.name] = v
	}
	for k, v := range after.series {
		if !strings.HasPrefix(k, "apiserver_request_total{") {
			continue
		}
		d := v - before.series[k]
		if d <= 0 {
			continue
		}
		key := label(k, "verb") + " " + label(k, "resource")
		if sr := label(k, "subresource"); sr != "" {
			key += "/" + sr
		}
		key += " " + label(k, "code")
		r.byVerb[key] += d
	}
	r.classes = classes(before, after)
	return r
}

// classes is the change of priority and fairness's per-class counters
// between two scrapes: dispatched, rejected (by reason), the wait histogram
// (its sum, count, and p99 and max as bucket bounds), estimated seats and
// execution time.
func classes(before, after snapshot) []classResult {
	byKey := map[[2]string]*classResult{}
	get := func(series string) *classResult {
		k := [2]string{label(series, "priority_level"), label(series, "flow_schema")}
		c := byKey[k]
		if c == nil {
			c = &classResult{pl: k[0], fs: k[1], rejectedBy: map[string]float64{}}
			byKey[k] = c
		}
		return c
	}
	buckets := map[[2]string]map[float64]float64{}
	for k, v := range after.series {
		name, _, ok := strings.Cut(k, "{")
		if !ok || !strings.HasPrefix(name, "apiserver_flowcontrol_") {
			continue
		}
		d := v - before.series[k]
		if d <= 0 {
			continue
		}
		switch name {
		case "apiserver_flowcontrol_dispatched_requests_total":
			get(k).dispatched += d
		case "apiserver_flowcontrol_rejected_requests_total":
			c := get(k)
			c.rejected += d
			c.rejectedBy[label(k, "reason")] += d
		case "apiserver_flowcontrol_request_wait_duration_seconds_sum":
			get(k).waitSum += d
		case "apiserver_flowcontrol_request_wait_duration_seconds_count":
			get(k).waitN += d
		case "apiserver_flowcontrol_request_wait_duration_seconds_bucket":
			c := get(k)
			le, err := strconv.ParseFloat(label(k, "le"), 64)
			if err != nil {
				le = math.Inf(1)
			}
			key := [2]string{c.pl, c.fs}
			if buckets[key] == nil {
				buckets[key] = map[float64]float64{}
			}
			buckets[key][le] += d // summed over execute="true" and "false"
		case "apiserver_flowcontrol_work_estimated_seats_sum":
			get(k).seatsSum += d
		case "apiserver_flowcontrol_work_estimated_seats_count":
			get(k).seatsN += d
		case "apiserver_flowcontrol_request_execution_seconds_sum":
			get(k).execSum += d
		case "apiserver_flowcontrol_request_execution_seconds_count":
			get(k).execN += d
		}
	}
	var out []classResult
	for key, c := range byKey {
		if b := buckets[key]; len(b) > 0 {
			les := make([]float64, 0, len(b))
			for le := range b {
				les = append(les, le)
			}
			sort.Float64s(les)
			total := b[les[len(les)-1]] // +Inf: every request
			for _, le := range les {
				if c.waitP99 == 0 && b[le] >= 0.99*total {
					c.waitP99 = le
				}
				if c.waitMax == 0 && b[le] >= total {
					c.waitMax = le
				}
			}
		}
		if c.dispatched > 0 || c.rejected > 0 {
			out = append(out, *c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].dispatched+out[i].rejected > out[j].dispatched+out[j].rejected })
	return out
}

// occupancy samples the priority levels' queues every interval until stop,
// from the API server's /debug/api_priority_and_fairness/dump_queues (a few
// kilobytes: a /metrics scrape of a 1,000-node API server takes 0.1-0.5 s of
// its time, too much to take twice a second beside what is measured), and
// returns their maximum and mean per level: requests and seats waiting in
// the level's queues, requests and seats executing.
type occupancy struct {
	samples int
	max     map[string]map[string]float64 // level -> column -> max
	sum     map[string]map[string]float64 // level -> column -> sum over samples
}

// occColumns are dump_queues' columns sampled, summed over a level's queues.
var occColumns = []struct{ column, name string }{
	{"PendingRequests", "in queue"},
	{"InitialSeatsSum", "seats in queue"},
	{"ExecutingRequests", "executing"},
	{"SeatsInUse", "seats executing"},
}

// add adds one dump_queues answer: a header line, then a line per queue.
func (o *occupancy) add(dump string) {
	lines := strings.Split(strings.TrimSpace(dump), "\n")
	if len(lines) < 2 {
		return
	}
	col := map[string]int{}
	for i, h := range strings.Split(lines[0], ",") {
		col[strings.TrimSpace(h)] = i
	}
	o.samples++
	cur := map[string]map[string]float64{}
	for _, l := range lines[1:] {
		f := strings.Split(l, ",")
		if len(f) < len(col) {
			continue
		}
		pl := strings.TrimSpace(f[col["PriorityLevelName"]])
		if cur[pl] == nil {
			cur[pl] = map[string]float64{}
		}
		for _, c := range occColumns {
			v, _ := strconv.ParseFloat(strings.TrimSpace(f[col[c.column]]), 64)
			cur[pl][c.name] += v
		}
	}
	for pl, cs := range cur {
		if o.max[pl] == nil {
			o.max[pl], o.sum[pl] = map[string]float64{}, map[string]float64{}
		}
		for c, v := range cs {
			o.max[pl][c] = max(o.max[pl][c], v)
			o.sum[pl][c] += v
		}
	}
}

// String is a table of the levels that queued or executed anything, and
// the driver's level always, with each level's seat limit at the phase's
// end (apiserver_flowcontrol_current_limit_seats).
func (o *occupancy) String(interval time.Duration, end snapshot) string {
	var b strings.Builder
	fmt.Fprintf(&b, "priority levels' queues sampled every %s (%d samples), max / mean:\n\n| priority level |", interval, o.samples)
	for _, c := range occColumns {
		fmt.Fprintf(&b, " %s |", c.name)
	}
	b.WriteString(" seat limit at end |\n|---|")
	for range occColumns {
		b.WriteString("---:|")
	}
	b.WriteString("---:|\n")
	pls := make([]string, 0, len(o.max))
	for pl, m := range o.max {
		if m["in queue"] > 0 || m["executing"] > 0 || pl == "ephemera-scratch-node" {
			pls = append(pls, pl)
		}
	}
	sort.Strings(pls)
	for _, pl := range pls {
		fmt.Fprintf(&b, "| %s |", pl)
		for _, c := range occColumns {
			fmt.Fprintf(&b, " %.4g / %.3g |", o.max[pl][c.name], o.sum[pl][c.name]/float64(max(o.samples, 1)))
		}
		fmt.Fprintf(&b, " %.0f |\n", end.sum("apiserver_flowcontrol_current_limit_seats", `priority_level="`+pl+`"`))
	}
	return b.String()
}

func label(series, name string) string {
	i := strings.Index(series, name+`="`)
	if i < 0 {
		return ""
	}
	rest := series[i+len(name)+2:]
	return rest[:strings.IndexByte(rest, '"')]
}

func (r phaseResult) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "### %s (%d nodes, %s)\n", r.name, r.nodes, r.duration.Round(100*time.Millisecond))
	if r.note != "" {
		fmt.Fprintf(&b, "%s\n", r.note)
	}
	fmt.Fprintf(&b, "| measure | total | per node | per node per minute |\n|---|---:|---:|---:|\n")
	mins := r.duration.Minutes()
	for _, m := range measured {
		v := r.values[m.name]
		if m.delta {
			fmt.Fprintf(&b, "| %s | %.4g | %.4g | %.4g |\n", m.name, v, v/float64(r.nodes), v/float64(r.nodes)/mins)
		} else {
			fmt.Fprintf(&b, "| %s (at end) | %.4g | %.4g | |\n", m.name, v, v/float64(r.nodes))
		}
	}
	if r.latency != "" {
		fmt.Fprintf(&b, "\nkube-system client (LIST namespaces every 50 ms): %s\n", r.latency)
	}
	if len(r.classes) > 0 {
		fmt.Fprintf(&b, "\npriority and fairness per request class (wait p99 and max: the wait histogram's bucket bounds):\n\n")
		fmt.Fprintf(&b, "| priority level | flow schema | dispatched | rejected (429) | wait s summed | wait mean ms | wait p99 ≤ s | wait max ≤ s | seats per request | execution mean ms |\n")
		fmt.Fprintf(&b, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, c := range r.classes {
			rej := fmt.Sprintf("%.0f", c.rejected)
			if c.rejected > 0 {
				var rs []string
				for k, v := range c.rejectedBy {
					rs = append(rs, fmt.Sprintf("%s %.0f", k, v))
				}
				sort.Strings(rs)
				rej += " (" + strings.Join(rs, ", ") + ")"
			}
			seats, exec := 0.0, 0.0
			if c.seatsN > 0 {
				seats = c.seatsSum / c.seatsN
			}
			if c.execN > 0 {
				exec = 1000 * c.execSum / c.execN
			}
			fmt.Fprintf(&b, "| %s | %s | %.0f | %s | %.3g | %.3g | %g | %g | %.2f | %.3g |\n", c.pl, c.fs, c.dispatched, rej,
				c.waitSum, 1000*c.waitMean(), c.waitP99, c.waitMax, seats, exec)
		}
	}
	if r.occ != "" {
		fmt.Fprintf(&b, "\n%s", r.occ)
	}
	keys := make([]string, 0, len(r.byVerb))
	for k := range r.byVerb {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return r.byVerb[keys[i]] > r.byVerb[keys[j]] })
	fmt.Fprintf(&b, "\nrequests by verb, resource, code:")
	for i, k := range keys {
		if i == 12 {
			break
		}
		fmt.Fprintf(&b, " %s=%.0f;", k, r.byVerb[k])
	}
	b.WriteString("\n\n")
	return b.String()
}
