// A shared receive queue is not `Sync`: its polls write its completion queue's poll area
// without a lock, so two threads must never poll it through shared references. (The verbs
// objects its queue pairs share across threads reach that queue only with the handle's key.)
fn shared_between_threads<T: Sync>() {}
fn main() {
    shared_between_threads::<rdma_dmabuf::SharedReceiveQueue>();
}
