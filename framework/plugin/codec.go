package plugin

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/content"
)

// contentCodec decodes one Content answer, checked against the driver's
// bounds before it is decoded: a single pass over the wire bytes counts the
// files and checks each path's length and depth and the answer's cost (data,
// path and content.FileOverhead per file), so an answer of a million empty
// files is refused before a million messages exist. It is made per call;
// refused is what the pass refused, for the caller's message.
type contentCodec struct {
	limits  content.Limits // WithDefaults applied, MaxBytes set
	refused error
}

var _ encoding.CodecV2 = (*contentCodec)(nil)

func (c *contentCodec) Name() string { return "proto" }

func (c *contentCodec) Marshal(v any) (mem.BufferSlice, error) {
	return encoding.GetCodecV2("proto").Marshal(v)
}

func (c *contentCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("plugin: cannot decode into %T", v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	if err := scanContent(buf.ReadOnlyData(), c.limits); err != nil {
		c.refused = err
		return err
	}
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

// errMalformed is a Content answer that is not a ContentResponse.
var errMalformed = errors.New("the answer is not a well-formed ContentResponse")

// scanContent checks the wire form of a ContentResponse (files = 1: File
// {path = 1, data = 2, mode = 3}) against l. Its cost is linear in len(b),
// and it allocates nothing but each path's string.
func scanContent(b []byte, l content.Limits) error {
	files := 0
	var cost int64
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errMalformed
		}
		b = b[n:]
		if num != 1 || typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return errMalformed
			}
			b = b[n:]
			continue
		}
		msg, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return errMalformed
		}
		b = b[n:]
		files++
		if err := l.CheckFiles(files); err != nil {
			return beyond(fmt.Errorf("%w or more", err))
		}
		name, size, err := scanFile(msg)
		if err != nil {
			return err
		}
		if err := l.CheckPath(name); err != nil {
			return beyond(err)
		}
		if err := content.CheckName(name); err != nil {
			return errors.New(unprefixed(err))
		}
		cost += content.Cost(name, size)
		if err := l.CheckBytes(cost); err != nil {
			return beyond(err)
		}
	}
	return nil
}

// scanFile returns the path of one File's wire form (the last one: proto3
// keeps the last value of a field given twice) and the bytes of its data
// (of every value given: an upper bound).
func scanFile(b []byte) (name string, size int, err error) {
	var path []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", 0, errMalformed
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			if path, n = protowire.ConsumeBytes(b); n < 0 {
				return "", 0, errMalformed
			}
		case num == 2 && typ == protowire.BytesType:
			var data []byte
			if data, n = protowire.ConsumeBytes(b); n < 0 {
				return "", 0, errMalformed
			}
			size += len(data)
		default:
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return "", 0, errMalformed
			}
		}
		b = b[n:]
	}
	return string(path), size, nil
}

// boundError is an answer beyond the driver's bounds, as opposed to one that
// breaks the protocol.
type boundError struct{ msg string }

func (e *boundError) Error() string { return e.msg }

func beyond(err error) error { return &boundError{unprefixed(err)} }

// unprefixed is err's message without api.ErrInvalidParams's prefix: a
// plugin's answer is not the pod's invalid parameter.
func unprefixed(err error) string {
	return strings.TrimPrefix(err.Error(), api.ErrInvalidParams.Error()+": ")
}
