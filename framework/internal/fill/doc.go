// Package fill puts what a volume holds into it once it is mounted: the pod's
// fsGroup on its root and the content provider's files, written atomically
// (framework/content) within Volumes.ContentTimeout and the lanes' content
// budget, charged to the content capacity when the volume is memory-backed
// (what it holds is recorded when it is written, in the volume's state
// record, and counted from the records at startup: never from the volume's
// files, which the pod may write), and the refresh of a live volume's
// content. Its core types are Filler, the
// lifecycle's hands on a volume's content, and Providers, which content
// provider fills the volumes of each backend and whose share of the lanes
// their content takes (its party).
//
// It sees a backend as Backend, the two methods of the lifecycle's view of
// one that it uses, the mounter as Mounter, and the state store as Records.
// It reports a refresh through the func it is made with (Config.Refreshed),
// so it cannot count it or post the lifecycle's events itself (TestLayers: it
// cannot import internal/lifecycle).
package fill
