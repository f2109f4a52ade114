// Package audit writes the audit log of `sandboxd wrap --audit`: one JSON
// object a line (JSON Lines), appended to a file as each event happens.
package audit
