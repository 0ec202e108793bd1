package images

import (
	"io"
	"os"
	"testing"

	"github.com/sirupsen/logrus"
)

func TestMain(m *testing.M) {
	// The registries these tests run log every request through logrus's
	// process-wide logger.
	logrus.SetOutput(io.Discard)
	os.Exit(m.Run())
}
