"""The kubelet HTTPS API of virtual nodes: the server (`server`), who may call it (`auth`), the stream
protocols of exec/attach/port-forward (`streams`), its serving certificate (`servingcert`) and the
approval of those certificates' requests (`csrapprove`)."""
