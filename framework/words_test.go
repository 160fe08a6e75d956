package framework

import (
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
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
