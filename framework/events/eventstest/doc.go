// Package eventstest adapts a client-go clientset, typically client-go's
// fake.Clientset in a test, to events.Client: its core type is [Client]. It links client-go's typed
// clients of every API group: import it from tests, not from a driver binary
// (which has kube.Client.Events).
package eventstest
