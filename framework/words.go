package framework

import (
	"fmt"
	"reflect"
	"regexp"
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

// words puts an operator's words (the flags) for the Options fields a
// message names: "Limits.MaxInFlight 0 (--max-in-flight) must be positive"
// reads "--max-in-flight 0 must be positive" once the flag is recorded. A
// message naming a field no flag sets is left as it is. The zero words (a
// driver without flags) change nothing.
type words struct {
	names map[string]string
	re    *regexp.Regexp
}

func newWords(names map[string]string) words {
	if len(names) == 0 {
		return words{}
	}
	paths := make([]string, 0, len(names))
	for p := range names {
		paths = append(paths, regexp.QuoteMeta(p))
	}
	// Longest first, so that a field is never taken for a shorter one it
	// starts with (the \b after the field guards the same).
	slices.SortFunc(paths, func(a, b string) int { return len(b) - len(a) })
	// A field, maybe written "Options.X" or "framework.Options.X", not part
	// of a longer path; its value (one word) and the flag in parentheses that
	// the message may give after it.
	re := regexp.MustCompile(`(^|[^\w.])(?:framework\.)?(?:Options\.)?(` + strings.Join(paths, "|") + `)\b( [^\s()]+)?( \((--[\w-]+)\))?`)
	return words{names: names, re: re}
}

// say returns msg in the operator's words.
func (w words) say(msg string) string {
	if w.re == nil {
		return msg
	}
	return w.re.ReplaceAllStringFunc(msg, func(m string) string {
		g := w.re.FindStringSubmatch(m)
		name := w.names[g[2]]
		out := g[1] + name + g[3]
		// The flag the message already gives after the field is dropped when
		// it is the one recorded; another is kept.
		if g[4] != "" && g[5] != name {
			out += g[4]
		}
		return out
	})
}

// err returns err in the operator's words; errors.Is and As still see err.
func (w words) err(err error) error {
	if err == nil || w.re == nil {
		return err
	}
	msg := w.say(err.Error())
	if msg == err.Error() {
		return err
	}
	return &wordsError{msg: msg, err: err}
}

type wordsError struct {
	msg string
	err error
}

func (e *wordsError) Error() string { return e.msg }
func (e *wordsError) Unwrap() error { return e.err }
