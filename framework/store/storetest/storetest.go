package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// Run checks that the stores made by newStore implement the [store.Store] contract.
// newStore is called once per subtest and must return an empty, open store; Run
// closes it when the subtest ends.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Helper()
	open := func(t *testing.T) store.Store {
		t.Helper()
		s := newStore(t)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}

	t.Run("RoundTrip", func(t *testing.T) {
		s := open(t)
		in := FullRecord("vol-full")
		in.Version = 0
		want := cloneRecord(in)
		want.Version = store.RecordVersion
		if err := s.Put(t.Context(), in); err != nil {
			t.Fatalf("Put: %v", err)
		}
		if in.Version != store.RecordVersion {
			t.Errorf("Put left r.Version = %d, want %d", in.Version, store.RecordVersion)
		}
		got, err := s.Get(t.Context(), in.VolumeID)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if diff := Diff(want, got); diff != "" {
			t.Errorf("Get after Put: %s", diff)
		}
	})

	t.Run("RoundTripMinimal", func(t *testing.T) {
		s := open(t)
		in := &store.Record{VolumeID: "vol-min", Phase: store.PhasePublishing}
		if err := s.Put(t.Context(), in); err != nil {
			t.Fatalf("Put: %v", err)
		}
		got, err := s.Get(t.Context(), "vol-min")
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if got.FSGroup != nil {
			t.Errorf("FSGroup = %d, want nil", *got.FSGroup)
		}
		if got.Source != nil {
			t.Errorf("Source = %+v, want nil", *got.Source)
		}
		if diff := Diff(in, got); diff != "" {
			t.Errorf("Get after Put: %s", diff)
		}
	})

	t.Run("EmptyMapsAndZeroFSGroup", func(t *testing.T) {
		s := open(t)
		zero := int64(0)
		in := &store.Record{
			VolumeID: "vol-empty",
			Params:   map[string]string{},
			State:    map[string]string{},
			FSGroup:  &zero, // zero is meaningful: must not become nil
			Source:   &api.Source{Path: "/x", Options: []string{}},
		}
		if err := s.Put(t.Context(), in); err != nil {
			t.Fatalf("Put: %v", err)
		}
		got, err := s.Get(t.Context(), "vol-empty")
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		// nil and empty are interchangeable for maps and slices.
		if len(got.Params) != 0 || len(got.State) != 0 || got.Source == nil || len(got.Source.Options) != 0 {
			t.Errorf("got %+v, want empty maps and options", got)
		}
		if got.FSGroup == nil || *got.FSGroup != 0 {
			t.Errorf("FSGroup = %v, want pointer to 0", got.FSGroup)
		}
	})

	t.Run("GetUnknown", func(t *testing.T) {
		s := open(t)
		_, err := s.Get(t.Context(), "vol-nope")
		if !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Get(unknown) error = %v, want ErrNotFound", err)
		}
	})

	t.Run("Delete", func(t *testing.T) {
		s := open(t)
		if err := s.Delete(t.Context(), "vol-nope"); err != nil {
			t.Errorf("Delete(unknown) = %v, want nil", err)
		}
		mustPut(t, s, FullRecord("vol-a"))
		mustPut(t, s, FullRecord("vol-b"))
		if err := s.Delete(t.Context(), "vol-a"); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if _, err := s.Get(t.Context(), "vol-a"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Get after Delete error = %v, want ErrNotFound", err)
		}
		if err := s.Delete(t.Context(), "vol-a"); err != nil {
			t.Errorf("second Delete = %v, want nil", err)
		}
		if _, err := s.Get(t.Context(), "vol-b"); err != nil {
			t.Errorf("Delete removed the wrong record: Get(vol-b) = %v", err)
		}
	})

	t.Run("Overwrite", func(t *testing.T) {
		s := open(t)
		first := FullRecord("vol-o")
		mustPut(t, s, first)
		second := FullRecord("vol-o")
		second.Phase = store.PhasePublished
		second.Params = map[string]string{"only": "this"}
		second.State = nil
		second.FSGroup = nil
		second.Source = &api.Source{Path: "/other"}
		second.Updated = second.Updated.Add(time.Minute)
		mustPut(t, s, second)
		got, err := s.Get(t.Context(), "vol-o")
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if diff := Diff(second, got); diff != "" {
			t.Errorf("after overwrite: %s", diff)
		}
		list, err := s.List(t.Context())
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		if len(list) != 1 {
			t.Errorf("List has %d records after overwrite, want 1", len(list))
		}
	})

	t.Run("ListOrder", func(t *testing.T) {
		s := open(t)
		list, err := s.List(t.Context())
		if err != nil {
			t.Fatalf("List(empty): %v", err)
		}
		if len(list) != 0 {
			t.Fatalf("List(empty) = %d records", len(list))
		}
		ids := []string{"csi-b", "csi-a2", "csi-c", "csi-a", "csi-B", "csi-a10"}
		want := []string{"csi-B", "csi-a", "csi-a10", "csi-a2", "csi-b", "csi-c"}
		for _, id := range ids {
			mustPut(t, s, FullRecord(id))
		}
		list, err = s.List(t.Context())
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		var got []string
		for _, r := range list {
			got = append(got, r.VolumeID)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("List order = %q, want %q", got, want)
		}
		for _, r := range list {
			if diff := Diff(FullRecord(r.VolumeID), r); diff != "" {
				t.Errorf("List record %s: %s", r.VolumeID, diff)
			}
		}
	})

	t.Run("NoAliasing", func(t *testing.T) {
		s := open(t)
		in := FullRecord("vol-alias")
		mustPut(t, s, in)
		want := FullRecord("vol-alias")

		// The caller keeps using its record after Put.
		mutate(in)
		got, err := s.Get(t.Context(), "vol-alias")
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if diff := Diff(want, got); diff != "" {
			t.Fatalf("mutating the record passed to Put changed the store: %s", diff)
		}

		// The caller mutates what Get returned.
		mutate(got)
		again, err := s.Get(t.Context(), "vol-alias")
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if diff := Diff(want, again); diff != "" {
			t.Fatalf("mutating the record returned by Get changed the store: %s", diff)
		}

		// And what List returned.
		list, err := s.List(t.Context())
		if err != nil || len(list) != 1 {
			t.Fatalf("List = %d records, %v", len(list), err)
		}
		mutate(list[0])
		again, err = s.Get(t.Context(), "vol-alias")
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if diff := Diff(want, again); diff != "" {
			t.Fatalf("mutating a record returned by List changed the store: %s", diff)
		}
	})

	t.Run("ConcurrentPuts", func(t *testing.T) {
		s := open(t)
		const n = 50
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				errs <- s.Put(t.Context(), FullRecord(fmt.Sprintf("vol-%03d", i)))
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("concurrent Put: %v", err)
			}
		}
		list, err := s.List(t.Context())
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		if len(list) != n {
			t.Fatalf("List = %d records, want %d", len(list), n)
		}
		for i, r := range list {
			if want := fmt.Sprintf("vol-%03d", i); r.VolumeID != want {
				t.Errorf("List[%d] = %s, want %s", i, r.VolumeID, want)
			}
		}
	})

	t.Run("InvalidPut", func(t *testing.T) {
		s := open(t)
		if err := s.Put(t.Context(), &store.Record{}); err == nil {
			t.Error("Put(empty volume ID) = nil, want error")
		}
		if err := s.Put(t.Context(), nil); err == nil {
			t.Error("Put(nil) = nil, want error")
		}
	})

	t.Run("ContextCanceled", func(t *testing.T) {
		s := open(t)
		mustPut(t, s, FullRecord("vol-ctx"))
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := s.Get(ctx, "vol-ctx"); !errors.Is(err, context.Canceled) {
			t.Errorf("Get(canceled) error = %v, want context.Canceled", err)
		}
		if err := s.Put(ctx, FullRecord("vol-ctx2")); !errors.Is(err, context.Canceled) {
			t.Errorf("Put(canceled) error = %v, want context.Canceled", err)
		}
		if err := s.Delete(ctx, "vol-ctx"); !errors.Is(err, context.Canceled) {
			t.Errorf("Delete(canceled) error = %v, want context.Canceled", err)
		}
		if _, err := s.List(ctx); !errors.Is(err, context.Canceled) {
			t.Errorf("List(canceled) error = %v, want context.Canceled", err)
		}
		// Nothing happened.
		list, err := s.List(t.Context())
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		if len(list) != 1 || list[0].VolumeID != "vol-ctx" {
			t.Errorf("a canceled call changed the store: %d records", len(list))
		}
	})

	t.Run("Closed", func(t *testing.T) {
		s := open(t)
		mustPut(t, s, FullRecord("vol-closed"))
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("second Close = %v, want nil", err)
		}
		if _, err := s.Get(t.Context(), "vol-closed"); err == nil {
			t.Error("Get after Close = nil error")
		}
		if err := s.Put(t.Context(), FullRecord("vol-x")); err == nil {
			t.Error("Put after Close = nil error")
		}
		if err := s.Delete(t.Context(), "vol-closed"); err == nil {
			t.Error("Delete after Close = nil error")
		}
		if _, err := s.List(t.Context()); err == nil {
			t.Error("List after Close = nil error")
		}
	})
}

// RunReopen checks that a persistent store keeps its records across Close and a
// new open of the same directory. open is called several times with the same dir
// and must return an open store; RunReopen closes every store it gets.
func RunReopen(t *testing.T, open func(t *testing.T, dir string) store.Store) {
	t.Helper()
	t.Run("Reopen", func(t *testing.T) {
		dir := t.TempDir()
		s := open(t, dir)
		for _, id := range []string{"vol-1", "vol-2", "vol-3"} {
			mustPut(t, s, FullRecord(id))
		}
		updated := FullRecord("vol-2")
		updated.Phase = store.PhasePublished
		mustPut(t, s, updated)
		if err := s.Delete(t.Context(), "vol-3"); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}

		s = open(t, dir)
		t.Cleanup(func() { _ = s.Close() })
		list, err := s.List(t.Context())
		if err != nil {
			t.Fatalf("List after reopen: %v", err)
		}
		want := []*store.Record{FullRecord("vol-1"), updated}
		want[0].Version = store.RecordVersion
		if len(list) != len(want) {
			t.Fatalf("List after reopen = %d records, want %d", len(list), len(want))
		}
		for i := range want {
			if diff := Diff(want[i], list[i]); diff != "" {
				t.Errorf("record %d after reopen: %s", i, diff)
			}
		}
		if _, err := s.Get(t.Context(), "vol-3"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("deleted record after reopen: Get error = %v, want ErrNotFound", err)
		}

		// The reopened store is writable and still durable.
		mustPut(t, s, FullRecord("vol-4"))
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		s = open(t, dir)
		if _, err := s.Get(t.Context(), "vol-4"); err != nil {
			t.Errorf("Get(vol-4) after second reopen: %v", err)
		}
	})
}

// FullRecord returns a record with every field set, identified by id. Each call
// returns a fresh value.
func FullRecord(id string) *store.Record {
	fsGroup, held := int64(2000), int64(1<<20)
	created := time.Date(2026, 3, 4, 5, 6, 7, 890123456, time.UTC)
	tmpfsUID := uint32(1000)
	return &store.Record{
		Version:    store.RecordVersion,
		VolumeID:   id,
		VolumeName: "scratch",
		TargetPath: "/var/lib/kubelet/pods/0b4b8e2c/volumes/kubernetes.io~csi/scratch/mount",
		Pod: api.Pod{
			Namespace:      "default",
			Name:           "web-0",
			UID:            "0b4b8e2c-7d1a-4f3e-9c55-3f1f8a2b9d10",
			ServiceAccount: "web",
		},
		Backend:  "tmpfs",
		Params:   map[string]string{"size": "64Mi", "mode": "0755"},
		Hash:     "sha256:0f1e2d3c",
		Size:     64 << 20,
		FSType:   "tmpfs",
		ReadOnly: true,
		FSGroup:  &fsGroup,
		Source: &api.Source{
			Path:         "tmpfs",
			FSType:       "tmpfs",
			Options:      []string{"size=67108864", "mode=0755"},
			MountOptions: []string{"noatime"},
			Tmpfs:        &api.Tmpfs{Size: 64 << 20, Mode: 0o755, UID: &tmpfsUID},
		},
		State:       map[string]string{"device": "/dev/loop3"},
		Phase:       store.PhasePublishing,
		ContentHeld: &held,
		Created:     created,
		Updated:     created.Add(time.Second).In(time.FixedZone("CET", 3600)),
	}
}

// Diff describes how got differs from want, or returns "". Times compare with
// time.Time.Equal, and nil and empty maps or slices are equal.
func Diff(want, got *store.Record) string {
	if want == nil || got == nil {
		if want == got {
			return ""
		}
		return fmt.Sprintf("want %+v, got %+v", want, got)
	}
	var diffs []string
	if !want.Created.Equal(got.Created) {
		diffs = append(diffs, fmt.Sprintf("Created: want %v, got %v", want.Created, got.Created))
	}
	if !want.Updated.Equal(got.Updated) {
		diffs = append(diffs, fmt.Sprintf("Updated: want %v, got %v", want.Updated, got.Updated))
	}
	w, g := normalize(want), normalize(got)
	wv, gv := reflect.ValueOf(w).Elem(), reflect.ValueOf(g).Elem()
	for i := range wv.NumField() {
		if !reflect.DeepEqual(wv.Field(i).Interface(), gv.Field(i).Interface()) {
			diffs = append(diffs, fmt.Sprintf("%s: want %s, got %s",
				wv.Type().Field(i).Name, show(wv.Field(i)), show(gv.Field(i))))
		}
	}
	if len(diffs) == 0 {
		return ""
	}
	return fmt.Sprint(diffs)
}

func show(v reflect.Value) string {
	if v.Kind() == reflect.Pointer && !v.IsNil() {
		return fmt.Sprintf("&%+v", v.Elem().Interface())
	}
	return fmt.Sprintf("%+v", v.Interface())
}

// normalize returns a copy of r with times zeroed and empty maps and slices nil.
func normalize(r *store.Record) *store.Record {
	c := cloneRecord(r)
	c.Created, c.Updated = time.Time{}, time.Time{}
	if len(c.Params) == 0 {
		c.Params = nil
	}
	if len(c.State) == 0 {
		c.State = nil
	}
	if c.Source != nil && len(c.Source.Options) == 0 {
		c.Source.Options = nil
	}
	return c
}

// cloneRecord deep-copies r independently of any store implementation.
func cloneRecord(r *store.Record) *store.Record {
	c := *r
	if r.Params != nil {
		c.Params = make(map[string]string, len(r.Params))
		for k, v := range r.Params {
			c.Params[k] = v
		}
	}
	if r.State != nil {
		c.State = make(map[string]string, len(r.State))
		for k, v := range r.State {
			c.State[k] = v
		}
	}
	if r.FSGroup != nil {
		g := *r.FSGroup
		c.FSGroup = &g
	}
	if r.ContentHeld != nil {
		n := *r.ContentHeld
		c.ContentHeld = &n
	}
	if r.Source != nil {
		src := *r.Source
		if r.Source.Options != nil {
			src.Options = append([]string{}, r.Source.Options...)
		}
		if r.Source.MountOptions != nil {
			src.MountOptions = append([]string{}, r.Source.MountOptions...)
		}
		if r.Source.Tmpfs != nil {
			t := *r.Source.Tmpfs
			if t.UID != nil {
				uid := *t.UID
				t.UID = &uid
			}
			src.Tmpfs = &t
		}
		c.Source = &src
	}
	return &c
}

// mutate changes every reference-typed part of r in place, and some values.
func mutate(r *store.Record) {
	r.Params["size"] = "1Ti"
	r.Params["added"] = "x"
	r.State["device"] = "/dev/loop9"
	*r.FSGroup = 42
	*r.ContentHeld = 7
	r.Source.Options[0] = "size=1"
	r.Source.MountOptions[0] = "strictatime"
	r.Source.Tmpfs.Size = 1
	*r.Source.Tmpfs.UID = 1001
	r.Source.Path = "/mutated"
	r.Phase = store.PhaseUnpublishing
	r.Pod.Name = "mutated"
}

func mustPut(t *testing.T, s store.Store, r *store.Record) {
	t.Helper()
	if err := s.Put(t.Context(), r); err != nil {
		t.Fatalf("Put(%s): %v", r.VolumeID, err)
	}
}
