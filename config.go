// Package sandboxd holds what belongs to the product as a whole: the default
// configuration file, embedded so the binary runs without any file beside it.
package sandboxd

import _ "embed"

// DefaultConfig is the text of sandbox.toml, the documented default
// configuration.
//
//go:embed sandbox.toml
var DefaultConfig string
