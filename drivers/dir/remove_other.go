//go:build !linux

package dir

import (
	"context"
	"os"
)

// removeAll removes dir and everything below it (os.RemoveAll); it looks at
// ctx only before it starts.
func removeAll(ctx context.Context, dir string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}
