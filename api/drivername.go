package api

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// MaxDriverNameLength is the longest driver name: the CSI spec's bound on
// GetPluginInfo's name, which the kubelet and the CSIDriver object share.
const MaxDriverNameLength = 63

// ValidateDriverName returns an error unless name can be a CSI driver's name
// and the name of its CSIDriver object: the API server's validation of a
// CSIDriver (a DNS-1123 subdomain: lower-case letters, digits, '-' and '.',
// each dot-separated label starting and ending with a letter or digit) and at
// most [MaxDriverNameLength] characters. The error says what is wrong and,
// when there is one, a name that would be accepted. framework.New checks
// Options.DriverName with it.
func ValidateDriverName(name string) error {
	problems := driverNameProblems(name)
	if len(problems) == 0 {
		return nil
	}
	msg := fmt.Sprintf("%q is not a valid CSI driver name: %s; a CSIDriver's name is a DNS-1123 subdomain of at most %d characters (lower-case letters, digits, '-' and '.', each dot-separated label starting and ending with a letter or digit), e.g. \"example.csi.example.com\"",
		name, strings.Join(problems, ", "), MaxDriverNameLength)
	if s := suggestDriverName(name); s != "" && s != name {
		msg += fmt.Sprintf("; %q would be accepted", s)
	}
	return errors.New(msg)
}

// driverNameProblems lists what is wrong with name, each problem once.
func driverNameProblems(name string) []string {
	if name == "" {
		return []string{"it is empty"}
	}
	var problems []string
	if n := len(name); n > MaxDriverNameLength {
		problems = append(problems, fmt.Sprintf("it is %d characters long", n))
	}
	var upper, other []string
	for _, r := range name {
		switch {
		case r >= 'A' && r <= 'Z':
			if s := string(r); !slices.Contains(upper, s) {
				upper = append(upper, s)
			}
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '.':
		default:
			if s := fmt.Sprintf("%q", r); !slices.Contains(other, s) {
				other = append(other, s)
			}
		}
	}
	if len(upper) > 0 {
		problems = append(problems, "it has upper-case letters ("+strings.Join(upper, " ")+")")
	}
	if len(other) > 0 {
		problems = append(problems, "it has characters other than letters, digits, '-' and '.' ("+strings.Join(other, " ")+")")
	}
	empty, dash := false, false
	for _, l := range strings.Split(name, ".") {
		switch {
		case l == "":
			empty = true
		case l[0] == '-' || l[len(l)-1] == '-':
			dash = true
		}
	}
	if empty {
		problems = append(problems, "it has an empty label (a leading, trailing or doubled '.')")
	}
	if dash {
		problems = append(problems, "a label starts or ends with '-'")
	}
	return problems
}

// suggestDriverName returns name made valid the obvious way (lower case,
// other characters as '-', empty labels and edge dashes dropped), or "" when
// that leaves nothing valid.
func suggestDriverName(name string) string {
	mapped := strings.Map(func(r rune) rune {
		switch {
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '.':
			return r
		}
		return '-'
	}, name)
	var labels []string
	for _, l := range strings.Split(mapped, ".") {
		if l = strings.Trim(l, "-"); l != "" {
			labels = append(labels, l)
		}
	}
	s := strings.Join(labels, ".")
	if len(driverNameProblems(s)) > 0 {
		return ""
	}
	return s
}
