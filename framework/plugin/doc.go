// Package plugin is the driver's side of the Ephemera plugin protocol
// (api/plugin/v1alpha1): it turns the unix socket of a plugin running as its
// own process, in any language, into a framework.Backend ([Backend], built by
// [New] from [Options]) that the driver configures like any other
// (framework.Options.Backends), selected by pods with the "backend" attribute.
//
// The driver keeps everything that needs privileges or must survive a crash:
// mounts, state, locks, rollback, reconcile and the orphan GC. The plugin says
// in its handshake which calls it implements; a plugin without CREATE provides
// content only, and its volumes are tmpfs mounts the driver makes.
//
// Failures: a plugin that is not running makes a publish fail with
// Unavailable (the kubelet retries) and leaves nothing behind; a plugin that
// dies or is slow during a first publish makes it fail and roll back; a
// failing refresh keeps the volume's last good content; a plugin that answers
// outside the protocol (a directory outside the shared directory, an unknown
// source, a bad volume ID, a file path with "..") gets an error naming it;
// after a reconnect (a restarted plugin, possibly another version) the
// handshake is made again.
//
// Errors: a plugin's error that carries its kind (a google.rpc.ErrorInfo of
// domain "ephemera.dev", as pluginserver sends) comes back wrapping the kind's
// sentinel (an api sentinel, an errno such as EBUSY, fs.ErrNotExist), so that
// the driver gives it the code it has in process; one without (a plugin in
// another language, an older one) is mapped by its code.
//
// Package pluginserver is the other side, for plugins written in Go.
package plugin
