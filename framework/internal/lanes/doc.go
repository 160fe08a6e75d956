// Package lanes holds the node's bulkheads (DESIGN 4f) as a collaborator of
// the lifecycle below it: the volume locks, the publish and teardown lanes by
// backend, the content budget and the refreshes by content provider, and the
// content capacity held in memory (Held). Its core types are Lanes, Budget and
// Held; package lifecycle sizes them (Options) and names the parties.
package lanes
