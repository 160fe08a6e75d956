// Package pluginv1alpha1 is the Go code generated from plugin.proto (make
// proto), version v1alpha1 of the Ephemera plugin protocol: the gRPC service a
// plugin serves on a unix socket to give an Ephemera node driver storage or
// content for its volumes. plugin.proto states the rules every plugin follows.
//
// # Types
//
//   - [PluginServer] is what a plugin implements ([RegisterPluginServer]; embed
//     [UnimplementedPluginServer]), [PluginClient] what the driver calls:
//     Handshake, Validate, Create, Delete, List, Check, Content, Authorize,
//     each with its Request and Response message.
//   - [Capability] names the calls a plugin implements, in its
//     [HandshakeResponse].
//   - [Volume], [Pod] and [Token] describe the volume a call is about;
//     [Source] ([Directory] or [Tmpfs]) is what Create answers the driver
//     mounts; [File] is one file of a Content answer.
//
// Go plugins rarely use this package directly: framework/pluginserver serves a
// framework.Backend, ContentProvider or Authorizer over it, and
// framework/plugin is the driver's side.
package pluginv1alpha1
