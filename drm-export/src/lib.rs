//! GPU and host dma-buf exporters.
