//! Safe RDMA verbs over dma-buf memory.
