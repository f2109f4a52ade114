// Package engine is sandboxd's one seam to the Docker Engine: it builds the
// client, names the part of the Engine API sandboxd uses, classifies the
// engine's errors, and runs, waits for and removes what sandboxd makes
// there, each call with a deadline; where the engine's processes are this
// host's, it can also kill a container's processes from here (KillOnHost).
//
// Nothing else in sandboxd imports the moby client. The option and result
// types of the operations are the client's own, under the same names here,
// so that code using API reads as the Engine API's documentation does.
package engine
