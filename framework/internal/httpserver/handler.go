package httpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/ephemera-csi/ephemera/api"
)

// Handler is the driver's HTTP handler (framework.Driver.Handler): GET
// /metrics (metrics), /healthz and /readyz (health) and, when volumes is
// set, /volumes, the list it returns in JSON.
func Handler(metrics http.Handler, health *Health, volumes func(context.Context) (*api.VolumeList, error)) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("GET /healthz", health.ServeHealthz)
	mux.HandleFunc("GET /readyz", health.ServeReadyz)
	if volumes != nil {
		mux.HandleFunc("GET /volumes", func(w http.ResponseWriter, r *http.Request) { serveVolumes(w, r, volumes) })
	}
	return mux
}

// volumesTimeout bounds GET /volumes.
const volumesTimeout = 10 * time.Second

// serveVolumes serves GET /volumes: the list, or 503 with the reason there
// is none.
func serveVolumes(w http.ResponseWriter, r *http.Request, volumes func(context.Context) (*api.VolumeList, error)) {
	ctx, cancel := context.WithTimeout(r.Context(), volumesTimeout)
	defer cancel()
	list, err := volumes(ctx)
	if err != nil {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(list) // the client went away
}
