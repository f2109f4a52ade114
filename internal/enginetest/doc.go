// Package enginetest provides an in-memory Docker Engine for tests that
// need sessions but no containers.
package enginetest
