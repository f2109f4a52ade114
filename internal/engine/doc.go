// Package engine is sandboxd's one seam to the Docker Engine: it builds the
// client, names the part of the Engine API sandboxd uses, and classifies
// the engine's errors.
//
// Nothing else in sandboxd imports the moby client. The option and result
// types of the operations are the client's own, under the same names here,
// so that code using API reads as the Engine API's documentation does.
package engine
