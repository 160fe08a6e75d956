package api

import (
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Attribute declares one volume attribute a driver accepts from pods, beside
// those of its backends (framework.Options.Volumes.AcceptedAttributes). The framework parses the
// declared attributes once per publish, before the backend sees the rest, and
// hands the parsed values to the backend and the content provider as
// Volume.Values. Build one with StringAttr, EnumAttr, PatternAttr,
// DNSLabelAttr, QuantityAttr, IntAttr or BoolAttr and refine it with Required
// or Default:
//
//	framework.Options{
//		Attributes: api.Attributes{
//			api.DNSLabelAttr("app").Required(),
//			api.EnumAttr("format", "json", "yaml").Default("json"),
//			api.QuantityAttr("cache", 1<<20, 64<<20).Default("4Mi"),
//		},
//	}
type Attribute struct {
	// Key is the attribute's name in volumeAttributes.
	Key string
	// Help says what the attribute is for; a refusal of a missing required
	// attribute or of a value that does not match a pattern ends with it.
	// Describe sets it.
	Help string

	required bool   // Required: refuse a pod that does not set it
	def      string // Default: parsed as if the pod had set it, when not empty
	kind     attrKind
	enum     []string
	pattern  *regexp.Regexp
	min      int64
	max      int64
}

type attrKind int

const (
	kindString attrKind = iota
	kindEnum
	kindPattern
	kindDNSLabel
	kindQuantity
	kindInt
	kindBool
	kindMode
)

// StringAttr is an attribute taking any string.
func StringAttr(key string) Attribute { return Attribute{Key: key, kind: kindString} }

// EnumAttr is an attribute taking one of allowed.
func EnumAttr(key string, allowed ...string) Attribute {
	return Attribute{Key: key, kind: kindEnum, enum: slices.Clone(allowed)}
}

// PatternAttr is an attribute whose whole value matches the regular expression
// expr (anchored at both ends). It panics when expr does not compile, as
// regexp.MustCompile does: declarations are fixed at build time.
func PatternAttr(key, expr string) Attribute {
	return Attribute{Key: key, kind: kindPattern, pattern: regexp.MustCompile(`^(?:` + expr + `)$`)}
}

// DNSLabelAttr is an attribute taking an RFC 1123 label (lower-case letters,
// digits and '-', starting and ending with a letter or digit, at most 63
// characters): the form of Kubernetes object names such as a ConfigMap's.
func DNSLabelAttr(key string) Attribute { return Attribute{Key: key, kind: kindDNSLabel} }

// QuantityAttr is an attribute taking a Kubernetes quantity ("64Mi") of bytes
// within [min, max] (a max of 0 is no maximum); see Params.Quantity.
func QuantityAttr(key string, min, max int64) Attribute {
	return Attribute{Key: key, kind: kindQuantity, min: min, max: max}
}

// IntAttr is an attribute taking a base-10 integer within [min, max].
func IntAttr(key string, min, max int64) Attribute {
	return Attribute{Key: key, kind: kindInt, min: min, max: max}
}

// BoolAttr is an attribute taking "true" or "false".
func BoolAttr(key string) Attribute { return Attribute{Key: key, kind: kindBool} }

// Required returns a copy of a that a pod must set.
func (a Attribute) Required() Attribute {
	a.required = true
	return a
}

// Describe returns a copy of a with help text for refusals (see Help).
func (a Attribute) Describe(help string) Attribute {
	a.Help = help
	return a
}

// Default returns a copy of a that takes value when the pod does not set it.
func (a Attribute) Default(value string) Attribute {
	a.def = value
	return a
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// parse checks raw against a and returns its value.
func (a Attribute) parse(raw string) (Value, error) {
	v := Value{Raw: raw, Set: true}
	switch a.kind {
	case kindEnum:
		if !slices.Contains(a.enum, raw) {
			return v, InvalidParamf("attribute %q: %q is not one of %s", a.Key, raw, quoteAll(a.enum))
		}
	case kindPattern:
		if !a.pattern.MatchString(raw) {
			return v, InvalidParamf("attribute %q: %q does not match %s%s", a.Key, raw, strings.TrimSuffix(strings.TrimPrefix(a.pattern.String(), "^(?:"), ")$"), a.help())
		}
	case kindDNSLabel:
		if len(raw) > 63 || !dnsLabel.MatchString(raw) {
			return v, InvalidParamf("attribute %q: %q is not a DNS label (at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit)", a.Key, raw)
		}
	case kindQuantity:
		n, err := Params{a.Key: raw}.Quantity(a.Key, 0)
		if err != nil {
			return v, err
		}
		if n < a.min || (a.max > 0 && n > a.max) {
			return v, InvalidParamf("attribute %q: %s is outside %s", a.Key, raw, a.quantityRange())
		}
		v.Int = n
	case kindInt:
		n, err := Params{a.Key: raw}.int(a.Key, 0, a.min, a.max)
		if err != nil {
			return v, err
		}
		v.Int = n
	case kindBool:
		b, err := Params{a.Key: raw}.bool(a.Key, false)
		if err != nil {
			return v, err
		}
		v.Bool = b
	case kindMode:
		m, err := Params{a.Key: raw}.fileMode(a.Key, 0)
		if err != nil {
			return v, err
		}
		v.Mode = m
	}
	return v, nil
}

func (a Attribute) help() string {
	if a.Help == "" {
		return ""
	}
	return ": " + a.Help
}

func quantity(n int64) string { return resource.NewQuantity(n, resource.BinarySI).String() }

func (a Attribute) quantityRange() string {
	if a.max > 0 {
		return fmt.Sprintf("%s to %s", quantity(a.min), quantity(a.max))
	}
	return "at least " + quantity(a.min)
}

// Attributes are the volume attributes a driver declares.
type Attributes []Attribute

// Keys returns the declared keys.
func (as Attributes) Keys() []string {
	keys := make([]string, len(as))
	for i, a := range as {
		keys[i] = a.Key
	}
	return keys
}

// Check reports a declaration that cannot work: an empty, repeated or reserved
// key (the kubelet's csi.storage.k8s.io/ prefix, or the framework's own "size" and
// "backend"), a required attribute with a default, a default its own check
// refuses, or a range whose minimum exceeds its maximum.
func (as Attributes) Check() error {
	seen := map[string]bool{}
	var errs []error
	for _, a := range as {
		switch {
		case a.Key == "":
			errs = append(errs, errors.New("an attribute has an empty key"))
		case seen[a.Key]:
			errs = append(errs, fmt.Errorf("attribute %q is declared twice", a.Key))
		case strings.HasPrefix(a.Key, ReservedPrefix):
			errs = append(errs, fmt.Errorf("attribute %q uses the kubelet's reserved prefix %s", a.Key, ReservedPrefix))
		case a.Key == ParamSize || a.Key == ParamBackend:
			errs = append(errs, fmt.Errorf("attribute %q is the framework's own; a driver cannot declare it", a.Key))
		}
		seen[a.Key] = true
		if a.required && a.def != "" {
			errs = append(errs, fmt.Errorf("attribute %q is required and has a default; choose one", a.Key))
		}
		if (a.kind == kindQuantity || a.kind == kindInt) && a.max != 0 && a.min > a.max {
			errs = append(errs, fmt.Errorf("attribute %q: minimum %d is more than maximum %d", a.Key, a.min, a.max))
		}
		if a.kind == kindEnum && len(a.enum) == 0 {
			errs = append(errs, fmt.Errorf("attribute %q: an enum with no allowed value", a.Key))
		}
		if a.def != "" {
			if _, err := a.parse(a.def); err != nil {
				errs = append(errs, fmt.Errorf("attribute %q: default: %w", a.Key, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Parse checks the declared attributes in p (other keys are left alone; see
// Split) and returns their values, defaults applied. Every problem is reported
// at once, each naming its attribute, in an error wrapping ErrInvalidParams.
func (as Attributes) Parse(p Params) (Values, error) {
	vals := make(Values, len(as))
	msgs := as.parseEach(p, nil, func(key string, v Value) { vals[key] = v })
	if len(msgs) > 0 {
		return nil, InvalidParamf("%s", strings.Join(msgs, "; "))
	}
	return vals, nil
}

// Split returns p without the declared keys: the attributes left for the
// backend.
func (as Attributes) Split(p Params) Params {
	if p == nil {
		return nil
	}
	c := make(Params, len(p))
	for k, v := range p {
		if !as.declares(k) {
			c[k] = v
		}
	}
	return c
}

// declares reports whether key is one of as.
func (as Attributes) declares(key string) bool {
	for _, a := range as {
		if a.Key == key {
			return true
		}
	}
	return false
}

// parseEach parses the declared attributes of p (a default where p lacks a
// key) and hands each value to put, skipping the keys p lacks for which kept
// is true; it returns a message for each attribute that is missing while
// required or does not parse.
func (as Attributes) parseEach(p Params, kept func(key string) bool, put func(key string, v Value)) []string {
	var msgs []string
	for _, a := range as {
		raw, ok := p[a.Key]
		switch {
		case !ok && kept != nil && kept(a.Key):
			continue // applied before: keeps its value
		case !ok && a.required:
			msgs = append(msgs, fmt.Sprintf("attribute %q is required%s", a.Key, a.help()))
			continue
		case !ok && a.def == "":
			continue
		case !ok:
			raw = a.def
		}
		v, err := a.parse(raw)
		if err != nil {
			msgs = append(msgs, strings.TrimPrefix(err.Error(), ErrInvalidParams.Error()+": "))
			continue
		}
		v.Set = ok
		put(a.Key, v)
	}
	return msgs
}

// Apply takes a backend's declared attributes out of v.Params: it refuses any
// key of v.Params not declared (an *UnknownAttributesError), parses the
// declared ones into v.Values (defaults applied) and removes them from
// v.Params. The framework applies the attributes a backend declares
// (framework.AttributeDeclarer) before the backend's Validate; a backend that
// may be called directly (from a plugin server, a wrapping backend or a test)
// applies them itself at the top of Validate and Create. Apply is idempotent:
// an attribute already in v.Values and no longer in v.Params keeps its value.
func (as Attributes) Apply(v *Volume) error {
	for k := range v.Params {
		if !as.declares(k) {
			return v.Params.Only(as.Keys()...) // the refusal, naming what is accepted
		}
	}
	// What Parse does for the attributes not applied before, into a list on
	// the stack: v.Values changes only when all of them parse. Apply runs on
	// every publish.
	type parsed struct {
		key string
		val Value
	}
	var buf [8]parsed
	got := buf[:0]
	msgs := as.parseEach(v.Params, v.Values.Has, func(key string, val Value) { got = append(got, parsed{key, val}) })
	if len(msgs) > 0 {
		return InvalidParamf("%s", strings.Join(msgs, "; "))
	}
	if v.Values == nil && len(got) > 0 {
		v.Values = make(Values, len(got))
	}
	for _, p := range got {
		v.Values[p.key] = p.val
	}
	v.Params = as.Split(v.Params)
	return nil
}

// Value is one parsed attribute.
type Value struct {
	// Raw is the attribute's text (the default's when the pod did not set it).
	Raw string
	// Set is true when the pod set the attribute, false when the default applies.
	Set bool
	// Int is the value of a QuantityAttr (bytes) or an IntAttr.
	Int int64
	// Bool is the value of a BoolAttr.
	Bool bool
	// Mode is the value of a ModeAttr.
	Mode fs.FileMode
}

// Values are a driver's declared attributes as parsed for one volume: the
// attributes the pod set and the defaults of those it did not. An attribute
// that is neither is absent.
type Values map[string]Value

// Has reports whether key has a value (set by the pod or by its default).
func (vs Values) Has(key string) bool {
	_, ok := vs[key]
	return ok
}

// String returns key's text, "" when absent.
func (vs Values) String(key string) string { return vs[key].Raw }

// Int returns the value of a QuantityAttr (bytes) or an IntAttr, 0 when absent.
func (vs Values) Int(key string) int64 { return vs[key].Int }

// Bool returns the value of a BoolAttr, false when absent.
func (vs Values) Bool(key string) bool { return vs[key].Bool }

// Mode returns the value of a ModeAttr, 0 when absent.
func (vs Values) Mode(key string) fs.FileMode { return vs[key].Mode }

// UnknownAttributesError is the error of Params.Only: attributes nobody
// accepts. It wraps ErrInvalidParams. The framework adds its own and the
// driver's declared keys to Accepted before the pod author sees it.
type UnknownAttributesError struct {
	Unknown  []string
	Accepted []string
}

func (e *UnknownAttributesError) Error() string {
	return fmt.Sprintf("%v: unknown attribute(s) %s; this driver accepts %s", ErrInvalidParams, quoteAll(e.Unknown), quoteAll(e.Accepted))
}

// Unwrap makes errors.Is(err, ErrInvalidParams) true.
func (e *UnknownAttributesError) Unwrap() error { return ErrInvalidParams }
