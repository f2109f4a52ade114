// Package console gives a command in a sandbox the user's terminal: raw
// mode while it runs, and the terminal's size as it changes.
package console
