// Package volstats answers the kubelet's volume stats and health calls
// (NodeGetVolumeStats, NodeGetVolumeHealth) for published volumes: the
// record, the target's mount, the backend's health check and the usage of the
// volume's filesystem or, for a directory volume, a bounded walk of it
// (internal/stats); and the description of the volumes GET /volumes lists
// (Describe). It changes nothing and takes no volume lock. Its core type is
// Reader.
package volstats
