package framework

import (
	"errors"
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
)

// field returns the field of o at path ("Limits.MaxInFlight").
func field(o *Options, path string) reflect.Value {
	v := reflect.ValueOf(o).Elem()
	for name := range strings.SplitSeq(path, ".") {
		v = v.FieldByName(name)
	}
	return v
}

// probe is a value for a flag that sets a field of type t, unlike its default.
func probe(t reflect.Type, cur reflect.Value) string {
	switch {
	case t == reflect.TypeFor[time.Duration]():
		return "7s"
	case t.Kind() == reflect.Bool:
		return map[bool]string{true: "false", false: "true"}[cur.Bool()]
	case t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Bool:
		return map[bool]string{true: "false", false: "true"}[cur.Elem().Bool()]
	case t.Kind() == reflect.Map:
		return "tmpfs=noexec"
	case t.Kind() == reflect.Float64:
		return "0.37"
	case t.Kind() == reflect.String:
		return "probe"
	default:
		return "7"
	}
}

// TestBindFlagsNamesFields: BindFlags records a field for every flag it
// binds, each a field of Options, and setting the flag sets that field.
func TestBindFlagsNamesFields(t *testing.T) {
	var o Options
	fs := flag.NewFlagSet("driver", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	BindFlags(fs, &o)
	byFlag := map[string]string{}
	for path := range o.flagNames {
		if !isOptionsField(path) {
			t.Errorf("recorded field %s is no field of Options", path)
		}
		byFlag[o.flagNames[path]] = path
	}
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		path, ok := byFlag["--"+f.Name]
		if !ok {
			t.Errorf("--%s: BindFlags does not record which field it sets (boundFlags)", f.Name)
			return
		}
		v := field(&o, path)
		before := reflect.ValueOf(v.Interface())
		if v.Kind() == reflect.Pointer {
			before = reflect.ValueOf(v.Elem().Interface())
		}
		if err := fs.Set(f.Name, probe(v.Type(), v)); err != nil {
			t.Errorf("--%s: %v", f.Name, err)
			return
		}
		after := v
		if v.Kind() == reflect.Pointer {
			after = v.Elem()
		}
		if reflect.DeepEqual(before.Interface(), after.Interface()) {
			t.Errorf("--%s does not set %s (still %v)", f.Name, path, after.Interface())
		}
	})
	if n != len(o.flagNames) {
		t.Errorf("%d flags, %d recorded fields", n, len(o.flagNames))
	}
	// A path that is no field is refused by New.
	o.SetFlagName("Limits.NoSuchField", "--x")
	if err := o.checkFlagNames(); err == nil || !strings.Contains(err.Error(), "Limits.NoSuchField") {
		t.Errorf("unknown field recorded: %v", err)
	}
}

func TestWords(t *testing.T) {
	w := newWords(map[string]string{
		"Limits.MaxInFlight":            "--max-in-flight",
		"Limits.MaxInFlightPerBackend":  "--max-in-flight-per-backend",
		"Observability.CSIDrivers":      "--events or --gc-confirm-with-api",
		"Node.StateDir":                 "--state-dir",
		"Limits.StatsWalk.Timeout":      "--stats-timeout",
		"Observability.MetricsAddress":  "--metrics-address",
		"Limits.Capacity":               "--capacity",
		"Volumes.ContentBytesInFlight":  "--content-bytes-in-flight",
		"Limits.InFlightReservedPerBac": "--never", // a prefix of no whole field: never matches
	})
	for in, want := range map[string]string{
		"Limits.MaxInFlight 0 (--max-in-flight) must be positive":                                                                   "--max-in-flight 0 must be positive",
		"Limits.MaxInFlightPerBackend 9 (--max-in-flight-per-backend) must be between 1 and Limits.MaxInFlight 8 (--max-in-flight)": "--max-in-flight-per-backend 9 must be between 1 and --max-in-flight 8",
		"no API access (Options.Observability.CSIDrivers not set)":                                                                  "no API access (--events or --gc-confirm-with-api not set)",
		`Node.StateDir "rel" must be an absolute path`:                                                                              `--state-dir "rel" must be an absolute path`,
		"Limits.StatsWalk.Timeout 0s must be positive":                                                                              "--stats-timeout 0s must be positive",
		"StatsWalk.Timeout alone is no field path of Options":                                                                       "StatsWalk.Timeout alone is no field path of Options",
		"a budget (Limits.Capacity); retrying does not help":                                                                        "a budget (--capacity); retrying does not help",
		"Limits.InFlightReservedPerBackend 3 (--in-flight-reserved-per-backend)":                                                    "Limits.InFlightReservedPerBackend 3 (--in-flight-reserved-per-backend)",
		"Volumes.ContentBytesInFlight 1Mi (--other-flag) is small":                                                                  "--content-bytes-in-flight 1Mi (--other-flag) is small",
	} {
		if got := w.say(in); got != want {
			t.Errorf("say(%q)\n = %q\nwant %q", in, got, want)
		}
	}
	// Without recorded flags (a driver built on the SDK alone) nothing changes.
	if got := (words{}).say("Limits.MaxInFlight 0 must be positive"); got != "Limits.MaxInFlight 0 must be positive" {
		t.Errorf("zero words: %q", got)
	}
	// err keeps what errors.Is sees.
	base := errors.New("Limits.MaxInFlight 0 must be positive")
	if err := w.err(base); err.Error() != "--max-in-flight 0 must be positive" || !errors.Is(err, base) {
		t.Errorf("err: %v", err)
	}
}

// TestNewWords: New's errors name the fields for a driver without flags, and
// the flags for one whose options BindFlags bound.
func TestNewWords(t *testing.T) {
	base := func() Options {
		return Options{DriverName: "x.example.com", Node: NodeOptions{ID: "n", StateDir: "/var/lib/x", KubeletRootDir: "/var/lib/kubelet"},
			Backends: map[string]Backend{"b": BackendFuncs{}}, Limits: LimitOptions{MaxInFlight: -1}}
	}
	_, err := New(base())
	if err == nil || !strings.Contains(err.Error(), "Limits.MaxInFlight -1") {
		t.Fatalf("New without flags: %v, want it to name Limits.MaxInFlight", err)
	}
	o := base()
	fs := flag.NewFlagSet("driver", flag.ContinueOnError)
	BindFlags(fs, &o)
	if err := fs.Parse([]string{"--max-in-flight=-1", "--state-dir=relative", "--metrics-address=nonsense"}); err != nil {
		t.Fatal(err)
	}
	_, err = New(o)
	if err == nil {
		t.Fatal("New accepted bad flags")
	}
	for _, want := range []string{"--max-in-flight -1", `--state-dir "relative"`, `--metrics-address "nonsense"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("New with flags: %v, want it to say %s", err, want)
		}
	}
	for _, field := range []string{"Options.", "Limits.", "Node.", "Observability."} {
		if strings.Contains(err.Error(), field) {
			t.Errorf("New with flags names a field (%s): %v", field, err)
		}
	}
}

// TestNeverFits: a volume larger than the backend's whole budget is
// InvalidArgument (retrying does not help), one that does not fit now is
// ResourceExhausted; with the flags recorded, both name --capacity.
func TestNeverFits(t *testing.T) {
	c := newCapacity(0, 0, map[string]int64{"tmpfs": 1 << 30}).withWords(newWords(map[string]string{"Limits.Capacity": "--capacity"}))
	err := c.reserve("d", "tmpfs", "pod", 2<<30)
	if got := errkind.Code(err); got != codes.InvalidArgument || !strings.Contains(err.Error(), "retrying does not help") || !strings.Contains(err.Error(), "(--capacity)") {
		t.Fatalf("larger than the budget: %v %v, want InvalidArgument saying retrying does not help, naming --capacity", got, err)
	}
	if err := c.reserve("d", "tmpfs", "pod", 1<<30); err != nil {
		t.Fatal(err)
	}
	err = c.reserve("d", "tmpfs", "pod", 1)
	if got := errkind.Code(err); got != codes.ResourceExhausted || !errors.Is(err, api.ErrResourceExhausted) || !strings.Contains(err.Error(), "(--capacity)") {
		t.Fatalf("budget in use: %v %v, want ResourceExhausted naming --capacity", got, err)
	}
	// The node's volume limit, as the e2e's kubelet event shows it.
	c = newCapacity(1, 0, nil).withWords(newWords(map[string]string{"Limits.MaxVolumesPerNode": "--max-volumes-per-node"}))
	if err := c.reserve("d", "tmpfs", "pod", 1); err != nil {
		t.Fatal(err)
	}
	err = c.reserve("d", "tmpfs", "pod", 1)
	if got := errkind.Code(err); got != codes.ResourceExhausted || !strings.Contains(err.Error(), "its maximum (--max-volumes-per-node 1)") {
		t.Fatalf("volume limit: %v %v, want ResourceExhausted naming --max-volumes-per-node 1", got, err)
	}
}
