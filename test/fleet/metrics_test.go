//go:build fleet

package fleet

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// snapshot is one scrape of the API server: series (name{labels}) to value,
// with its CPU seconds and time.
type snapshot struct {
	series map[string]float64
	cpu    float64
	at     time.Time
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
	return r
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
