// Package hostpath checks host paths whose contents sandboxd trusts (its
// configuration, the packages it builds images from): that nobody but
// their owner and root can change what they hold.
package hostpath
