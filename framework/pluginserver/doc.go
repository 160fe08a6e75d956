// Package pluginserver serves a framework.Backend, ContentProvider and
// Authorizer written in Go as an out-of-process plugin of an Ephemera driver,
// over the plugin protocol (api/plugin/v1alpha1) on a unix socket:
//
//	err := pluginserver.Serve(ctx, pluginserver.Options{
//		Name:     "tokens",
//		Endpoint: "unix:///run/ephemera/plugins/tokens.sock",
//		Content:  myContentProvider,
//	})
//
// Serve is [New] then [Server.Run], for a plugin that has nothing else to run.
// The driver starts it with --plugin tokens=unix:///run/ephemera/plugins/tokens.sock.
// The plugin needs no privileges: it never mounts anything. A Backend whose
// Create returns a directory must keep it below Options.Dir, the directory it
// shares with the driver; a tmpfs source is mounted by the driver. Other
// sources (block devices) do not cross the protocol.
package pluginserver
