// Package metrics holds the Prometheus metrics of an Ephemera driver.
//
// The framework creates one [Metrics] per driver, in the driver's own registry
// (never prometheus.DefaultRegisterer), and records into it; a driver serves it
// with Options.Observability.MetricsAddress or mounts Driver.Handler in its own server. The
// names and label values are constants here, so the framework's code and tests
// refer to one definition; it is internal, and the names are documented for
// operators in docs/design.md and docs/operations.md.
//
// # Metrics
//
//   - ephemera_rpc_duration_seconds{method,code} histogram: every CSI call
//     (errors are its _count with code!="OK"; there is no separate error counter).
//   - csi_plugin_operations_seconds{driver_name,method_name,grpc_status_code}
//     histogram: the same calls as csi-lib-utils' metrics manager records them
//     for a CSI plugin (full method name, its buckets), for kubernetes-csi
//     dashboards. Not through csi-lib-utils itself: its metrics package links
//     k8s.io/component-base/metrics and OpenTelemetry into the binary.
//   - ephemera_backend_operation_duration_seconds{backend,op,result} histogram:
//     Backend.Create, Backend.Delete and Lister.List.
//   - ephemera_volumes{backend}, ephemera_volume_bytes{backend} gauges: read from
//     the driver's capacity accounting at scrape time; ephemera_capacity_bytes{backend}:
//     the budget of each backend that has one.
//   - ephemera_reconcile_total{result}, ephemera_gc_total{result},
//     ephemera_refresh_total{result} counters, ephemera_state_recoveries_total.
//   - ephemera_inflight_operations gauge, ephemera_build_info{driver,version}.
//   - ephemera_content_held_bytes and ephemera_content_capacity_bytes gauges,
//     for drivers with content.
//   - ephemera_csidriver_misconfigured{check} gauge: the startup check of the
//     CSIDriver object.
//   - ephemera_stats_walks_total{result} counter: walks of directory volumes
//     by NodeGetVolumeStats, complete or stopped short by a bound.
//   - The Go runtime (go_*) and process (process_*) collectors.
//
// No metric has a per-volume or per-pod label: a node runs hundreds of
// short-lived volumes and each would be a new series.
package metrics
