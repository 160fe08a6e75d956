package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
)

// Log formats (--log-format).
const (
	logFormatText = "text"
	logFormatJSON = "json"
)

// setLogFormat makes klog write format to w: "text" is klog's own format
// (nothing changes), "json" one JSON object per line through log/slog's JSON
// handler. klog keeps deciding what is logged (--v, --vmodule); the JSON is
// only how it is written. component-base's JSON format (--logging-format=json)
// would link zap and component-base's logs and feature-gate packages for the
// same lines; log/slog is in the binary already (klog uses it).
func setLogFormat(format string, w io.Writer) error {
	switch format {
	case logFormatText:
		return nil
	case logFormatJSON:
		klog.SetLogger(logr.FromSlogHandler(jsonHandler(w)))
		return nil
	default:
		return fmt.Errorf("--log-format=%q: want text or json", format)
	}
}

// jsonHandler writes records as JSON lines: {"time", "level" (INFO or
// ERROR), "msg", the key/value pairs, "v" (the klog verbosity of an info
// line; none on errors)}. Values are written as klog's text format writes
// them: a logr.Marshaler as what MarshalLog returns (api.Volume's identity,
// redacted secrets and tokens), an error as its message, a fmt.Stringer (the
// gRPC requests protosanitizer strips) as its string, a time.Duration as its
// string ("1.5s").
func jsonHandler(w io.Writer) slog.Handler {
	return verbosityHandler{slog.NewJSONHandler(w, &slog.HandlerOptions{
		Level:       slog.Level(-1 << 10), // klog has filtered already
		ReplaceAttr: logValue,
	})}
}

// logValue is the ReplaceAttr of jsonHandler.
func logValue(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String()) // "28.17ms", not nanoseconds
	}
	if a.Value.Kind() != slog.KindAny {
		return a
	}
	v := a.Value.Any()
	if m, ok := v.(logr.Marshaler); ok {
		v = marshalLog(m)
	}
	switch x := v.(type) {
	case error:
		return slog.String(a.Key, x.Error())
	case json.Marshaler:
		return slog.Any(a.Key, x)
	case fmt.Stringer:
		return slog.String(a.Key, x.String())
	}
	return slog.Any(a.Key, v)
}

// marshalLog calls MarshalLog, turning a panic (a nil receiver) into a
// message as klog does.
func marshalLog(m logr.Marshaler) (v any) {
	defer func() {
		if r := recover(); r != nil {
			v = fmt.Sprintf("<panic: %v>", r)
		}
	}()
	return m.MarshalLog()
}

// verbosityHandler turns the slog levels logr gives klog's verbosity (V(n) is
// level -n) back into level INFO with "v": n.
type verbosityHandler struct{ slog.Handler }

func (h verbosityHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelError {
		v := max(int(slog.LevelInfo-r.Level), 0)
		r = r.Clone()
		r.Level = slog.LevelInfo
		r.AddAttrs(slog.Int("v", v))
	}
	return h.Handler.Handle(ctx, r)
}

func (h verbosityHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return verbosityHandler{h.Handler.WithAttrs(as)}
}

func (h verbosityHandler) WithGroup(name string) slog.Handler {
	return verbosityHandler{h.Handler.WithGroup(name)}
}
