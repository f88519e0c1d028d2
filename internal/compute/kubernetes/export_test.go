package kubernetes

// SetBeforeAdoptWrite installs a hook that runs between Adopt's read of the
// Sandbox and its conditional write.
func SetBeforeAdoptWrite(d *Driver, f func()) { d.beforeAdoptWrite = f }
