package api_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2/textlogger"

	"github.com/ephemera-csi/ephemera/api"
)

const (
	secretTok  = "eyJhbGciOiJSUzI1NiJ9.SECRET-TOKEN-TEXT"
	secretTok2 = "eyJhbGciOiJSUzI1NiJ9.OTHER-SECRET"
	tokJSON    = `{"vault":{"token":"` + secretTok + `","expirationTimestamp":"2026-05-01T12:00:00Z"},` +
		`"":{"token":"` + secretTok2 + `","expirationTimestamp":"2026-05-01T13:00:00Z"}}`
	otherJSON = `{"other":{"token":"x","expirationTimestamp":"2026-05-01T12:00:00Z"}}`
)

var exp = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func TestParseTokens(t *testing.T) {
	want := api.Tokens{
		"vault": {Token: secretTok, ExpirationTimestamp: exp},
		"":      {Token: secretTok2, ExpirationTimestamp: exp.Add(time.Hour)},
	}
	for _, tc := range []struct {
		desc          string
		secrets, vctx map[string]string
		want          api.Tokens
	}{
		{"volume_context", nil, map[string]string{api.KeyServiceAccountTokens: tokJSON}, want},
		{"secrets", map[string]string{api.KeyServiceAccountTokens: tokJSON}, map[string]string{"x": "y"}, want},
		{"secrets win", map[string]string{api.KeyServiceAccountTokens: tokJSON}, map[string]string{api.KeyServiceAccountTokens: otherJSON}, want},
		{"secrets without key fall back", map[string]string{"other": "v"}, map[string]string{api.KeyServiceAccountTokens: tokJSON}, want},
		{"absent", map[string]string{"a": "b"}, map[string]string{"c": "d"}, nil},
		{"nil maps", nil, nil, nil},
		{"empty object", nil, map[string]string{api.KeyServiceAccountTokens: `{}`}, api.Tokens{}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			got, err := api.ParseTokens(tc.secrets, tc.vctx)
			if err != nil {
				t.Fatal(err)
			}
			if (got == nil) != (tc.want == nil) || len(got) != len(tc.want) {
				t.Fatalf("got %d tokens (nil %v), want %d (nil %v)", len(got), got == nil, len(tc.want), tc.want == nil)
			}
			for aud, w := range tc.want {
				g, ok := got[aud]
				if !ok || g.Token != w.Token || !g.ExpirationTimestamp.Equal(w.ExpirationTimestamp) {
					t.Errorf("audience %q: got %v (present %v)", aud, g.ExpirationTimestamp, ok)
				}
			}
		})
	}
}

func TestParseTokensMalformed(t *testing.T) {
	for _, raw := range []string{
		`{"vault":{"token":"` + secretTok + `"`,                                // truncated
		`{"vault":{"token":"` + secretTok + `","expirationTimestamp":"soon"}}`, // bad time
		`{"vault":{"token":` + "12345" + `}}`,                                  // wrong type
		`["` + secretTok + `"]`,                                                // not an object
		`{"vault":"` + secretTok + `"}`,                                        // value not an object
		secretTok,                                                              // not JSON
		`null`,
		``,
	} {
		for _, where := range []string{"secrets", "volume_context"} {
			m := map[string]string{api.KeyServiceAccountTokens: raw}
			var err error
			if where == "secrets" {
				_, err = api.ParseTokens(m, nil)
			} else {
				_, err = api.ParseTokens(nil, m)
			}
			if !errors.Is(err, api.ErrInvalidParams) {
				t.Fatalf("%s %.20q: err = %v, want ErrInvalidParams", where, raw, err)
			}
			msg := err.Error()
			for _, leak := range []string{"SECRET", "eyJ", "12345", "soon", "vault"} {
				if strings.Contains(msg, leak) {
					t.Errorf("error message leaks %q: %s", leak, msg)
				}
			}
			if !strings.Contains(msg, where) {
				t.Errorf("error message does not say where: %s", msg)
			}
		}
	}
}

func sample() api.Tokens {
	return api.Tokens{"vault": {Token: secretTok, ExpirationTimestamp: exp}, "": {Token: secretTok2, ExpirationTimestamp: exp}}
}

func TestTokensRedactedFmt(t *testing.T) {
	toks := sample()
	tok := toks["vault"]
	type holder struct {
		T  api.Token
		TS api.Tokens
		P  *api.Token
	}
	for _, s := range []string{
		//lint:ignore S1025 the test checks what each verb prints, %s included
		fmt.Sprintf("%v", toks), fmt.Sprintf("%+v", toks), fmt.Sprintf("%#v", toks), fmt.Sprintf("%s", toks),
		fmt.Sprintf("%v", tok), fmt.Sprintf("%+v", tok), fmt.Sprintf("%#v", tok), fmt.Sprint(&tok),
		fmt.Sprintf("%v", holder{tok, toks, &tok}), fmt.Sprintf("%+v", holder{tok, toks, &tok}),
		fmt.Sprintf("%#v", holder{tok, toks, &tok}),
		fmt.Sprintf("%v", []api.Token{tok}), fmt.Sprintf("%v", map[string]api.Tokens{"x": toks}),
	} {
		if strings.Contains(s, "SECRET") {
			t.Errorf("fmt leaks the token: %s", s)
		}
		if !strings.Contains(s, "REDACTED") {
			t.Errorf("fmt output %q is not marked redacted", s)
		}
	}
	if s := fmt.Sprint(toks); !strings.Contains(s, `"vault"`) || !strings.Contains(s, "2026-05-01T12:00:00Z") {
		t.Errorf("String should show audiences and expirations: %s", s)
	}
}

func TestTokensRedactedJSON(t *testing.T) {
	toks := sample()
	for _, v := range []any{toks, toks["vault"], &toks, map[string]any{"t": toks}, struct{ T api.Token }{toks["vault"]}} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("SECRET")) || !bytes.Contains(b, []byte("REDACTED")) {
			t.Errorf("json.Marshal(%T) = %s", v, b)
		}
	}
	b, _ := json.Marshal(toks)
	var back map[string]map[string]string
	if err := json.Unmarshal(b, &back); err != nil || back["vault"]["expirationTimestamp"] != "2026-05-01T12:00:00Z" {
		t.Errorf("marshaled form %s: %v", b, err)
	}
}

func TestTokensRedactedLog(t *testing.T) {
	var buf bytes.Buffer
	log := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&buf), textlogger.Verbosity(10)))
	toks := sample()
	tok := toks["vault"]
	log.Info("publishing", "tokens", toks, "token", tok, "ptr", &tok)
	log.WithValues("tokens", toks).V(5).Info("nested", "map", map[string]any{"t": toks})
	log.Error(errors.New("boom"), "failed", "tokens", toks)
	out := buf.String()
	if strings.Contains(out, "SECRET") {
		t.Errorf("log leaks the token:\n%s", out)
	}
	if strings.Count(out, "REDACTED") < 5 {
		t.Errorf("log output not redacted as expected:\n%s", out)
	}
	t.Log(out)
}
