//! `sideway_basic_cost`: the write-cost loop with `sideway`'s basic queue pair and completion
//! queue (`build`: `ibv_create_qp`, `ibv_create_cq`; each post collects its work requests in
//! `Vec`s and calls `ibv_post_send`, each poll fills a `Vec` through `ibv_poll_cq`). See the
//! `sideway_loop` library.

fn main() {
    sideway_loop::run::<sideway_loop::Basic>();
}
