package words

import (
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Words puts an operator's words (the flags) for the Options fields a
// message names: "Limits.MaxInFlight 0 (--max-in-flight) must be positive"
// reads "--max-in-flight 0 must be positive" once the flag is recorded. A
// message naming a field no flag sets is left as it is. The zero words (a
// driver without flags) change nothing.
type Words struct {
	names map[string]string
	re    *regexp.Regexp
}

func New(names map[string]string) Words {
	if len(names) == 0 {
		return Words{}
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
	return Words{names: names, re: re}
}

// Say returns msg in the operator's words.
func (w Words) Say(msg string) string {
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

// Err returns err in the operator's words; errors.Is and As still see err.
func (w Words) Err(err error) error {
	if err == nil || w.re == nil {
		return err
	}
	msg := w.Say(err.Error())
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

// Bytes writes n bytes as a Kubernetes quantity ("64Mi"), as flags take them.
func Bytes(n int64) string {
	return resource.NewQuantity(n, resource.BinarySI).String()
}
