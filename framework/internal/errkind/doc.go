// Package errkind is the module's one table from errors to gRPC codes, used by
// the driver's CSI servers (framework) and by plugins (framework/pluginserver),
// and the way an error's kind crosses the plugin protocol, so that a backend's
// error gives the same code in process and through a plugin.
//
// # Kinds
//
// A [Kind] is a sentinel error (an api sentinel, a mount or store sentinel, an
// errno, a context error, or one of the framework's own below) with its code
// and its reason, the name it has on the wire. The table, [Kinds], is ordered:
// an error matching several kinds (errors.Is) has the first one's.
//
// # The code of an error
//
// Code decides, in this order: the outermost kind an error is marked with
// (With); the code of a gRPC status in its chain (a backend or content
// provider may return one); the first kind of the table its chain matches;
// Internal.
//
// # On the wire
//
// A plugin answers an error with its code and a google.rpc.ErrorInfo detail
// (Domain, and the kind's reason, or ReasonStatus for a status of the
// backend's own). The driver turns the answer back into an error wrapping the
// kind's sentinel (FromWire), which Code maps to the same code. An answer
// without the detail (an older plugin, one in another language, the
// protocol's own refusals) or with a reason this version does not know keeps
// the mapping by code of framework/plugin.
package errkind
