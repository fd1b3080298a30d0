package protocol

import "time"

// The deployment record: the settings every process of one deployment must
// agree on, written by the first scheduler or supervisor that creates the
// streams and compared by every process at start-up. A process whose setting
// differs refuses to start and names both values.
const (
	// BucketDeployment holds the deployment record.
	BucketDeployment = "warden_deployment"
	// KeyDeployment is the record's key in BucketDeployment.
	KeyDeployment = "deployment"
)

// Deployment is the value of the deployment record (JSON). A zero setting is
// not recorded: the process that writes the record first records what it
// knows, and a later process adds a setting the record lacks.
type Deployment struct {
	// TaskShards is the number of task streams (WARDEN_TASKS_<n>): an
	// agent's task subject and consumer live on shard Shard(pool, agent, n).
	TaskShards int `json:"task_shards,omitempty"`
	// Partitions is the number of scheduler partitions submissions and
	// results are stored under (Partition(job, n)).
	Partitions int `json:"partitions,omitempty"`
	// WrittenBy names the connection that last wrote the record.
	WrittenBy string `json:"written_by,omitempty"`
	// WrittenAt is when the record was last written.
	WrittenAt time.Time `json:"written_at"`
}
