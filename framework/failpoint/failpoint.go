package failpoint

// Names of the failpoints; tests iterate over All.
const (
	PublishBeforeCreate      = "publish-before-create"
	PublishAfterCreate       = "publish-after-create"
	PublishAfterMkdir        = "publish-after-mkdir"
	PublishAfterMount        = "publish-after-mount"
	PublishAfterContent      = "publish-after-content"
	PublishAfterDone         = "publish-after-done"
	UnpublishAfterUnmount    = "unpublish-after-unmount"
	UnpublishAfterRemoveDir  = "unpublish-after-rmdir"
	UnpublishAfterDelete     = "unpublish-after-delete"
	UnpublishAfterRecordGone = "unpublish-after-record-gone"
)

// Publish and Unpublish list the failpoints of each operation in order.
var (
	Publish = []string{PublishBeforeCreate, PublishAfterCreate, PublishAfterMkdir,
		PublishAfterMount, PublishAfterContent, PublishAfterDone}
	Unpublish = []string{UnpublishAfterUnmount,
		UnpublishAfterRemoveDir, UnpublishAfterDelete, UnpublishAfterRecordGone}
)
