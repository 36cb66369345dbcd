//! `sideway_cost`: the write-cost loop with `sideway`'s extended queue pair and completion
//! queue (`build_ex`: `ibv_create_qp_ex`, `ibv_create_cq_ex`), as its own `rc_pingpong`
//! example uses them. See the `sideway_loop` library.

fn main() {
    sideway_loop::run::<sideway_loop::Extended>();
}
