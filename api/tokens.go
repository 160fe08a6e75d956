package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// redactedToken replaces a token's text wherever a Token is printed, logged or
// marshaled.
const redactedToken = "***REDACTED***"

// Token is one service-account token the kubelet requested for the pod
// (CSIDriver.spec.tokenRequests). It prints, logs and marshals with the token
// text redacted; only the expiration shows.
type Token struct {
	// Token is the bearer token. Never log it.
	Token string `json:"token"`
	// ExpirationTimestamp is when the token expires.
	ExpirationTimestamp time.Time `json:"expirationTimestamp"`
}

// safeToken is what a Token shows instead of itself.
type safeToken struct {
	Token               string    `json:"token"`
	ExpirationTimestamp time.Time `json:"expirationTimestamp"`
}

func (t Token) safe() safeToken { return safeToken{redactedToken, t.ExpirationTimestamp} }

// String implements fmt.Stringer without revealing the token.
func (t Token) String() string {
	return "{token:" + redactedToken + " expires:" + t.ExpirationTimestamp.UTC().Format(time.RFC3339) + "}"
}

// GoString implements fmt.GoStringer without revealing the token.
func (t Token) GoString() string {
	return fmt.Sprintf("api.Token{Token:%q, ExpirationTimestamp:%q}", redactedToken, t.ExpirationTimestamp.UTC().Format(time.RFC3339))
}

// MarshalLog implements logr.Marshaler without revealing the token.
func (t Token) MarshalLog() any { return t.safe() }

// MarshalJSON never reveals the token.
func (t Token) MarshalJSON() ([]byte, error) { return json.Marshal(t.safe()) }

// Tokens maps audience to token, as the kubelet passes them under
// KeyServiceAccountTokens. The empty audience "" is the API server's. Tokens
// prints, logs and marshals with every token redacted; audiences and expirations
// show.
type Tokens map[string]Token

func (ts Tokens) safe() map[string]safeToken {
	if ts == nil {
		return nil
	}
	m := make(map[string]safeToken, len(ts))
	for aud, t := range ts {
		m[aud] = t.safe()
	}
	return m
}

func (ts Tokens) format(verbose bool) string {
	auds := make([]string, 0, len(ts))
	for aud := range ts {
		auds = append(auds, aud)
	}
	sort.Strings(auds)
	var b strings.Builder
	if verbose {
		b.WriteString("api.Tokens")
	}
	b.WriteByte('{')
	for i, aud := range auds {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q:%s", aud, ts[aud].String())
	}
	b.WriteByte('}')
	return b.String()
}

// String implements fmt.Stringer without revealing tokens.
func (ts Tokens) String() string { return ts.format(false) }

// GoString implements fmt.GoStringer without revealing tokens.
func (ts Tokens) GoString() string { return ts.format(true) }

// MarshalLog implements logr.Marshaler without revealing tokens.
func (ts Tokens) MarshalLog() any { return ts.safe() }

// MarshalJSON never reveals tokens.
func (ts Tokens) MarshalJSON() ([]byte, error) { return json.Marshal(ts.safe()) }

// ParseTokens returns the service-account tokens the kubelet passed to
// NodePublishVolume under KeyServiceAccountTokens. Since Kubernetes 1.35
// (CSIDriver serviceAccountTokenInSecrets) they arrive in the request's secrets,
// before that in its volume_context; secrets are read first, as KEP-5538
// recommends for version skew. It returns nil, nil when neither has the key (the
// CSIDriver has no tokenRequests). Malformed JSON returns an error wrapping
// ErrInvalidParams that never quotes the value, which holds tokens.
func ParseTokens(secrets, volumeContext map[string]string) (Tokens, error) {
	raw, where := "", ""
	if v, ok := secrets[KeyServiceAccountTokens]; ok {
		raw, where = v, "secrets"
	} else if v, ok := volumeContext[KeyServiceAccountTokens]; ok {
		raw, where = v, "volume_context"
	} else {
		return nil, nil
	}
	var m map[string]Token
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		// json errors quote parts of the input: describe, never wrap.
		why := "is not valid JSON"
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		var tim *time.ParseError
		switch {
		case errors.As(err, &syn):
			why = fmt.Sprintf("is not valid JSON (syntax error at byte %d of %d)", syn.Offset, len(raw))
		case errors.As(err, &typ):
			kind, _, _ := strings.Cut(typ.Value, " ") // "number 1" quotes the input
			why = fmt.Sprintf(`is not a JSON object {"<audience>":{"token":…,"expirationTimestamp":…}} (unexpected %s at byte %d)`, kind, typ.Offset)
		case errors.As(err, &tim):
			why = "has an expirationTimestamp that is not RFC 3339"
		}
		return nil, InvalidParamf("%s[%s] %s", where, KeyServiceAccountTokens, why)
	}
	if m == nil { // "null"
		return nil, InvalidParamf("%s[%s] is null, want a JSON object", where, KeyServiceAccountTokens)
	}
	return Tokens(m), nil
}
