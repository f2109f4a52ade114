// Package images builds sandboxd's base image from Debian packages without a
// registry, reproducibly.
package images
