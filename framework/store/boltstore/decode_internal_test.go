package boltstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// decodeSlow is decode as it was before leadingVersion: the version read by
// unmarshaling the whole document once more.
func decodeSlow(id string, raw []byte) (*store.Record, error) {
	var head struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, fmt.Errorf("%w: %q: %v", store.ErrUndecodable, id, err)
	}
	if head.Version > store.RecordVersion {
		return nil, fmt.Errorf("%w: record %q has version %d, this driver knows %d",
			store.ErrVersion, id, head.Version, store.RecordVersion)
	}
	r := new(store.Record)
	if err := json.Unmarshal(raw, r); err != nil {
		return nil, fmt.Errorf("%w: %q: %v", store.ErrUndecodable, id, err)
	}
	if r.VolumeID != id {
		return nil, fmt.Errorf("%w: %q: the record is for volume %q", store.ErrUndecodable, id, r.VolumeID)
	}
	return r, nil
}

// sameDecode fails t unless decode and decodeSlow agree on raw: the same
// record, or errors of the same kind.
func sameDecode(t *testing.T, raw []byte) {
	t.Helper()
	got, gerr := decode("csi-1", raw)
	want, werr := decodeSlow("csi-1", raw)
	for _, kind := range []error{store.ErrUndecodable, store.ErrVersion} {
		if errors.Is(gerr, kind) != errors.Is(werr, kind) {
			t.Fatalf("decode(%q): %v; the full decode: %v", raw, gerr, werr)
		}
	}
	if (gerr == nil) != (werr == nil) || !reflect.DeepEqual(got, want) {
		t.Fatalf("decode(%q) = %+v, %v; the full decode: %+v, %v", raw, got, gerr, want, werr)
	}
}

func sampleRecord(version int) []byte {
	g := int64(2000)
	r := store.Record{
		Version: version, VolumeID: "csi-1", VolumeName: "data", TargetPath: "/k/pods/u/volumes/kubernetes.io~csi/data/mount",
		Pod: api.Pod{Namespace: "ns", Name: "p", UID: "u"}, Backend: "tmpfs", Params: map[string]string{"size": "1Mi"},
		Hash: "h", Size: 1 << 20, FSGroup: &g, Source: &api.Source{Path: "ephemera-tmpfs", FSType: "tmpfs"},
		Phase: store.PhasePublished, Created: time.Unix(1, 0).UTC(), Updated: time.Unix(2, 0).UTC(),
	}
	b, err := json.Marshal(r)
	if err != nil {
		panic(err)
	}
	return b
}

// The version read from the shape put writes gives what decoding the whole
// document for it gave, for records as written, of newer versions, and for
// documents that only look like them.
func TestLeadingVersion(t *testing.T) {
	cases := [][]byte{
		sampleRecord(store.RecordVersion),
		sampleRecord(0),
		sampleRecord(store.RecordVersion + 1),
		sampleRecord(123456789),
		[]byte(`{"version":1}`),
		[]byte(`{"version":2}`),
		[]byte(`{"version":01,"volumeID":"csi-1"}`),
		[]byte(`{"version":1,"volumeID":"csi-1","version":2}`),
		[]byte(`{"version":1,"volumeID":"csi-1","params":{"version":"9"}}`),
		[]byte(`{"version":1,"volumeID":"csi-1",`),
		[]byte(`{"version":1`),
		[]byte(`{"version":-1,"volumeID":"csi-1"}`),
		[]byte(`{"version":1.5,"volumeID":"csi-1"}`),
		[]byte(`{"version":1e3,"volumeID":"csi-1"}`),
		[]byte(`{"version":"1","volumeID":"csi-1"}`),
		[]byte(`{ "version":1,"volumeID":"csi-1"}`),
		[]byte(`{"volumeID":"csi-1","version":9}`),
		[]byte(`{"version":1,"volumeID":"csi-2"}`),
		[]byte(`{"version":1,"volumeID":"csi-1","size":"x"}`),
		[]byte(`{"version":99999999999,"volumeID":"csi-1"}`),
		[]byte(`{"version":`),
		[]byte(``),
	}
	for _, raw := range cases {
		sameDecode(t, raw)
	}
	if v, ok := leadingVersion(sampleRecord(store.RecordVersion)); !ok || v != store.RecordVersion {
		t.Errorf("leadingVersion of a record as put writes it: %d, %v", v, ok)
	}
}

func FuzzLeadingVersion(f *testing.F) {
	f.Add(sampleRecord(store.RecordVersion))
	f.Add(sampleRecord(store.RecordVersion + 1))
	f.Add([]byte(`{"version":1,"volumeID":"csi-1","version":2}`))
	f.Fuzz(func(t *testing.T, raw []byte) { sameDecode(t, raw) })
}
