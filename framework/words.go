package framework

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// SetFlagName records that the command-line flag name sets the Options field
// at path ("Limits.MaxInFlight", as the field is written in Go below
// Options): the driver's messages to an operator then say name where they
// would name the field, in New's errors, the logs and the errors of the RPCs.
// name is what the operator sets, "--max-in-flight", or a phrase such as
// "--events or --gc-confirm-with-api" when several flags set the field.
// BindFlags records its own flags; a driver records those it binds to Options
// fields itself. A driver without flags records nothing, and its messages name
// the fields. New refuses a path that is no field of Options.
func (o *Options) SetFlagName(path, name string) {
	if o.flagNames == nil {
		o.flagNames = map[string]string{}
	}
	o.flagNames[path] = name
}

// checkFlagNames refuses a recorded path that names no field of Options.
func (o *Options) checkFlagNames() error {
	var bad []string
	for p := range o.flagNames {
		if !isOptionsField(p) {
			bad = append(bad, p)
		}
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		return fmt.Errorf("SetFlagName: Options has no field %s", strings.Join(bad, ", "))
	}
	return nil
}

// isOptionsField reports whether path ("Limits.MaxInFlight") is a field of
// Options, through nested structs.
func isOptionsField(path string) bool {
	t := reflect.TypeFor[Options]()
	for name := range strings.SplitSeq(path, ".") {
		if t.Kind() != reflect.Struct {
			return false
		}
		f, ok := t.FieldByName(name)
		if !ok || !f.IsExported() {
			return false
		}
		t = f.Type
	}
	return path != ""
}
