// Package refresh schedules the content refreshes a driver starts itself: on
// request (Refresh, RefreshAll), every RefreshInterval, and the retries of
// failed ones with backoff; it keeps in memory the credentials of each
// volume's latest publish for them. Its core type is Scheduler. What a refresh
// does is the lifecycle's refresh event, which the Scheduler only fires.
package refresh
