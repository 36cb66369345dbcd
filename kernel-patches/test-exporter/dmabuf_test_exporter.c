// SPDX-License-Identifier: GPL-2.0
/*
 * A dma-buf exporter for testing importers against the dma-buf contract.
 *
 * Importers must not look at the struct pages of a mapping. This exporter
 * makes that visible: the sg_table its map_dma_buf hands out carries DMA
 * addresses, but the page pointers of its CPU view are poisoned the way
 * CONFIG_DMABUF_DEBUG does it (mangle_sg_table() in 6.12 to 6.19), so an
 * importer that calls sg_page() on it faults. The sanctioned CPU access,
 * vmap, works: it returns a kernel mapping of the buffer's pages. User
 * space mmaps the buffer to fill it and check it.
 *
 * A second kind of buffer reports its vmap as I/O memory
 * (iosys_map.is_iomem), for importers that must refuse such mappings. The
 * pages are still system memory: only the report differs.
 *
 * /dev/dmabuf_test_exporter takes one ioctl, DTE_IOCTL_CREATE, which
 * returns the fd of a new, zero-filled dma-buf of the given size (rounded
 * up to pages).
 */

#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/file.h>
#include <linux/iosys-map.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/vmalloc.h>

MODULE_IMPORT_NS(DMA_BUF);

struct dte_create {
	__u64 size;	/* in: bytes */
	__u32 flags;	/* in: DTE_IOMEM */
	__s32 fd;	/* out: the dma-buf */
};

#define DTE_IOMEM		0x1
#define DTE_IOCTL_CREATE	_IOWR('D', 0xe0, struct dte_create)
#define DTE_MAX_SIZE		(256ULL << 20)

/* As mangle_sg_table(): every bit of the page pointer but the SG_ flags. */
#define DTE_POISON		(~0xffUL)

struct dte_buffer {
	struct page **pages;
	unsigned long npages;
	void *vaddr;
	bool iomem;
};

static void dte_poison(struct sg_table *sgt)
{
	struct scatterlist *sg;
	unsigned int i;

	for_each_sgtable_sg(sgt, sg, i)
		sg->page_link ^= DTE_POISON;
}

static struct sg_table *dte_map_dma_buf(struct dma_buf_attachment *attach,
					enum dma_data_direction dir)
{
	struct dte_buffer *buf = attach->dmabuf->priv;
	struct sg_table *sgt;
	int err;

	sgt = kzalloc(sizeof(*sgt), GFP_KERNEL);
	if (!sgt)
		return ERR_PTR(-ENOMEM);

	err = sg_alloc_table_from_pages(sgt, buf->pages, buf->npages, 0,
					buf->npages << PAGE_SHIFT, GFP_KERNEL);
	if (err)
		goto err_free;

	err = dma_map_sgtable(attach->dev, sgt, dir, 0);
	if (err)
		goto err_table;

	dte_poison(sgt);
	return sgt;

err_table:
	sg_free_table(sgt);
err_free:
	kfree(sgt);
	return ERR_PTR(err);
}

static void dte_unmap_dma_buf(struct dma_buf_attachment *attach,
			      struct sg_table *sgt,
			      enum dma_data_direction dir)
{
	dte_poison(sgt);
	dma_unmap_sgtable(attach->dev, sgt, dir, 0);
	sg_free_table(sgt);
	kfree(sgt);
}

static int dte_vmap(struct dma_buf *dmabuf, struct iosys_map *map)
{
	struct dte_buffer *buf = dmabuf->priv;

	if (buf->iomem)
		iosys_map_set_vaddr_iomem(map, (void __force __iomem *)buf->vaddr);
	else
		iosys_map_set_vaddr(map, buf->vaddr);
	return 0;
}

static int dte_mmap(struct dma_buf *dmabuf, struct vm_area_struct *vma)
{
	struct dte_buffer *buf = dmabuf->priv;

	return vm_map_pages(vma, buf->pages, buf->npages);
}

static void dte_free(struct dte_buffer *buf)
{
	unsigned long i;

	if (buf->vaddr)
		vunmap(buf->vaddr);
	for (i = 0; i < buf->npages; i++)
		if (buf->pages[i])
			__free_page(buf->pages[i]);
	kvfree(buf->pages);
	kfree(buf);
}

static void dte_release(struct dma_buf *dmabuf)
{
	dte_free(dmabuf->priv);
}

static const struct dma_buf_ops dte_ops = {
	.map_dma_buf = dte_map_dma_buf,
	.unmap_dma_buf = dte_unmap_dma_buf,
	.vmap = dte_vmap,
	.mmap = dte_mmap,
	.release = dte_release,
};

static struct dte_buffer *dte_alloc(unsigned long npages, bool iomem)
{
	struct dte_buffer *buf;
	unsigned long i;

	buf = kzalloc(sizeof(*buf), GFP_KERNEL);
	if (!buf)
		return NULL;
	buf->iomem = iomem;
	buf->pages = kvcalloc(npages, sizeof(*buf->pages), GFP_KERNEL);
	if (!buf->pages)
		goto err;
	buf->npages = npages;
	for (i = 0; i < npages; i++) {
		buf->pages[i] = alloc_page(GFP_KERNEL | __GFP_ZERO);
		if (!buf->pages[i])
			goto err;
	}
	buf->vaddr = vmap(buf->pages, npages, VM_MAP, PAGE_KERNEL);
	if (!buf->vaddr)
		goto err;
	return buf;

err:
	dte_free(buf);
	return NULL;
}

static long dte_create(struct dte_create __user *arg)
{
	DEFINE_DMA_BUF_EXPORT_INFO(exp_info);
	struct dma_buf *dmabuf;
	struct dte_buffer *buf;
	struct dte_create req;
	int fd;

	if (copy_from_user(&req, arg, sizeof(req)))
		return -EFAULT;
	if (!req.size || req.size > DTE_MAX_SIZE || req.flags & ~DTE_IOMEM)
		return -EINVAL;

	buf = dte_alloc(PAGE_ALIGN(req.size) >> PAGE_SHIFT,
			req.flags & DTE_IOMEM);
	if (!buf)
		return -ENOMEM;

	exp_info.exp_name = buf->iomem ? "test_exporter_iomem" : "test_exporter";
	exp_info.ops = &dte_ops;
	exp_info.size = buf->npages << PAGE_SHIFT;
	exp_info.flags = O_RDWR;
	exp_info.priv = buf;
	dmabuf = dma_buf_export(&exp_info);
	if (IS_ERR(dmabuf)) {
		dte_free(buf);
		return PTR_ERR(dmabuf);
	}

	fd = get_unused_fd_flags(O_CLOEXEC);
	if (fd < 0) {
		dma_buf_put(dmabuf);
		return fd;
	}
	if (put_user(fd, &arg->fd)) {
		put_unused_fd(fd);
		dma_buf_put(dmabuf);
		return -EFAULT;
	}
	fd_install(fd, dmabuf->file);
	return 0;
}

static long dte_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	if (cmd != DTE_IOCTL_CREATE)
		return -ENOTTY;
	return dte_create((struct dte_create __user *)arg);
}

static const struct file_operations dte_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = dte_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

static struct miscdevice dte_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "dmabuf_test_exporter",
	.fops = &dte_fops,
	.mode = 0666,
};

module_misc_device(dte_misc);

MODULE_DESCRIPTION("dma-buf exporter with poisoned sg_table pages, for testing importers");
MODULE_LICENSE("GPL");
