//go:build !failpoints

package failpoint

// Enabled reports whether this binary was built with failpoints.
const Enabled = false

// Hit does nothing: this binary was built without the failpoints tag.
func Hit(string) {}
