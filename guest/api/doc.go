// Package api is the protocol between the host and cocoon-agent: the
// ttrpc Agent service (agent.proto, generated into agent.pb.go and
// agent_ttrpc.pb.go by `make proto`) and the header that opens every stream
// of the agent session.
package api

//go:generate protoc --proto_path=. --go_out=. --go_opt=paths=source_relative --go-ttrpc_out=. --go-ttrpc_opt=paths=source_relative agent.proto
