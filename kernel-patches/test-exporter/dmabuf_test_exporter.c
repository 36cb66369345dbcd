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
 * A third kind is a dynamic exporter (it has pin and unpin) that moves its
 * backing on request (DTE_IOCTL_MOVE) unless an attachment has pinned it,
 * and then calls dma_buf_move_notify(), as a TTM driver evicting a buffer
 * does. An importer that neither pins nor listens would keep using the old
 * pages; those are kept until the buffer is released, so such an importer
 * shows in the counters and in its data, not as a use after free.
 *
 * Every buffer counts the calls importers make into it (attach, detach,
 * map, unmap, pin, unpin, vmap, vunmap, begin_cpu_access, end_cpu_access,
 * moves): debugfs dmabuf_test_exporter/buffers has one line per live
 * buffer, keyed by the inode number of its file (what fstat() of the fd
 * says), and a last line with the number of buffers released while an
 * importer still held one of them (attach, pin, vmap or begin without its
 * counterpart).
 *
 * /dev/dmabuf_test_exporter takes DTE_IOCTL_CREATE, which returns the fd of
 * a new, zero-filled dma-buf of the given size (rounded up to pages), and
 * DTE_IOCTL_MOVE.
 */

#include <linux/debugfs.h>
#include <linux/dma-buf.h>
#include <linux/dma-resv.h>
#include <linux/dma-mapping.h>
#include <linux/file.h>
#include <linux/iosys-map.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/scatterlist.h>
#include <linux/seq_file.h>
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
#define DTE_MOVABLE		0x2
#define DTE_IOCTL_CREATE	_IOWR('D', 0xe0, struct dte_create)
/* Moves the backing of the movable buffer whose fd is the argument. */
#define DTE_IOCTL_MOVE		_IO('D', 0xe1)
#define DTE_MAX_SIZE		(256ULL << 20)

/* As mangle_sg_table(): every bit of the page pointer but the SG_ flags. */
#define DTE_POISON		(~0xffUL)

enum dte_counter {
	DTE_ATTACH, DTE_DETACH, DTE_MAP, DTE_UNMAP, DTE_PIN, DTE_UNPIN,
	DTE_VMAP, DTE_VUNMAP, DTE_BEGIN, DTE_END, DTE_MOVE, DTE_COUNTERS
};

static const char * const dte_counter_names[DTE_COUNTERS] = {
	"attach", "detach", "map", "unmap", "pin", "unpin",
	"vmap", "vunmap", "begin", "end", "moves",
};

/* The pages of one placement of a buffer, with their kernel mapping. */
struct dte_backing {
	struct list_head node;	/* dte_buffer.retired */
	struct page **pages;
	void *vaddr;
};

struct dte_buffer {
	struct list_head node;	/* dte_buffers */
	unsigned long ino;
	unsigned long npages;
	struct dte_backing *backing;
	/* earlier placements of a movable buffer, freed at release */
	struct list_head retired;
	bool iomem;
	atomic_t count[DTE_COUNTERS];
};

static LIST_HEAD(dte_buffers);
static DEFINE_MUTEX(dte_buffers_lock);
/* Buffers released with an attach, pin, vmap or begin not undone. */
static atomic_t dte_unbalanced;
static struct dentry *dte_debugfs;

static void dte_count(struct dma_buf *dmabuf, enum dte_counter c)
{
	struct dte_buffer *buf = dmabuf->priv;

	atomic_inc(&buf->count[c]);
}

static int dte_held(struct dte_buffer *buf, enum dte_counter take)
{
	return atomic_read(&buf->count[take]) -
	       atomic_read(&buf->count[take + 1]);
}

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

	dte_count(attach->dmabuf, DTE_MAP);
	sgt = kzalloc(sizeof(*sgt), GFP_KERNEL);
	if (!sgt)
		return ERR_PTR(-ENOMEM);

	err = sg_alloc_table_from_pages(sgt, buf->backing->pages, buf->npages, 0,
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
	dte_count(attach->dmabuf, DTE_UNMAP);
	dte_poison(sgt);
	dma_unmap_sgtable(attach->dev, sgt, dir, 0);
	sg_free_table(sgt);
	kfree(sgt);
}

static int dte_vmap(struct dma_buf *dmabuf, struct iosys_map *map)
{
	struct dte_buffer *buf = dmabuf->priv;
	void *vaddr = buf->backing->vaddr;

	dte_count(dmabuf, DTE_VMAP);
	if (buf->iomem)
		iosys_map_set_vaddr_iomem(map, (void __force __iomem *)vaddr);
	else
		iosys_map_set_vaddr(map, vaddr);
	return 0;
}

static void dte_vunmap(struct dma_buf *dmabuf, struct iosys_map *map)
{
	dte_count(dmabuf, DTE_VUNMAP);
}

static int dte_attach(struct dma_buf *dmabuf,
		      struct dma_buf_attachment *attach)
{
	dte_count(dmabuf, DTE_ATTACH);
	return 0;
}

static void dte_detach(struct dma_buf *dmabuf,
		       struct dma_buf_attachment *attach)
{
	dte_count(dmabuf, DTE_DETACH);
}

static int dte_pin(struct dma_buf_attachment *attach)
{
	dte_count(attach->dmabuf, DTE_PIN);
	return 0;
}

static void dte_unpin(struct dma_buf_attachment *attach)
{
	dte_count(attach->dmabuf, DTE_UNPIN);
}

static int dte_begin_cpu_access(struct dma_buf *dmabuf,
				enum dma_data_direction dir)
{
	dte_count(dmabuf, DTE_BEGIN);
	return 0;
}

static int dte_end_cpu_access(struct dma_buf *dmabuf,
			      enum dma_data_direction dir)
{
	dte_count(dmabuf, DTE_END);
	return 0;
}

static int dte_mmap(struct dma_buf *dmabuf, struct vm_area_struct *vma)
{
	struct dte_buffer *buf = dmabuf->priv;

	return vm_map_pages(vma, buf->backing->pages, buf->npages);
}

static void dte_free_backing(struct dte_backing *b, unsigned long npages)
{
	unsigned long i;

	if (b->vaddr)
		vunmap(b->vaddr);
	for (i = 0; i < npages; i++)
		if (b->pages[i])
			__free_page(b->pages[i]);
	kvfree(b->pages);
	kfree(b);
}

static struct dte_backing *dte_alloc_backing(unsigned long npages)
{
	struct dte_backing *b;
	unsigned long i;

	b = kzalloc(sizeof(*b), GFP_KERNEL);
	if (!b)
		return NULL;
	b->pages = kvcalloc(npages, sizeof(*b->pages), GFP_KERNEL);
	if (!b->pages)
		goto err;
	for (i = 0; i < npages; i++) {
		b->pages[i] = alloc_page(GFP_KERNEL | __GFP_ZERO);
		if (!b->pages[i])
			goto err;
	}
	b->vaddr = vmap(b->pages, npages, VM_MAP, PAGE_KERNEL);
	if (!b->vaddr)
		goto err;
	return b;

err:
	dte_free_backing(b, npages);
	return NULL;
}

static void dte_free(struct dte_buffer *buf)
{
	struct dte_backing *b, *tmp;

	list_for_each_entry_safe(b, tmp, &buf->retired, node)
		dte_free_backing(b, buf->npages);
	if (buf->backing)
		dte_free_backing(buf->backing, buf->npages);
	kfree(buf);
}

static void dte_release(struct dma_buf *dmabuf)
{
	struct dte_buffer *buf = dmabuf->priv;

	mutex_lock(&dte_buffers_lock);
	list_del(&buf->node);
	mutex_unlock(&dte_buffers_lock);
	if (dte_held(buf, DTE_ATTACH) || dte_held(buf, DTE_PIN) ||
	    dte_held(buf, DTE_VMAP) || dte_held(buf, DTE_BEGIN)) {
		pr_info("dmabuf_test_exporter: buffer %lu released unbalanced\n",
			buf->ino);
		atomic_inc(&dte_unbalanced);
	}
	dte_free(buf);
}

#define DTE_OPS(...) {						\
	.attach = dte_attach,					\
	.detach = dte_detach,					\
	.map_dma_buf = dte_map_dma_buf,				\
	.unmap_dma_buf = dte_unmap_dma_buf,			\
	.begin_cpu_access = dte_begin_cpu_access,		\
	.end_cpu_access = dte_end_cpu_access,			\
	.vmap = dte_vmap,					\
	.vunmap = dte_vunmap,					\
	.mmap = dte_mmap,					\
	.release = dte_release,					\
	__VA_ARGS__						\
}

/* A static exporter: its buffers never move. */
static const struct dma_buf_ops dte_ops = DTE_OPS();

/* A dynamic exporter: a buffer moves on DTE_IOCTL_MOVE unless pinned. */
static const struct dma_buf_ops dte_movable_ops =
	DTE_OPS(.pin = dte_pin, .unpin = dte_unpin);

static struct dte_buffer *dte_alloc(unsigned long npages, bool iomem)
{
	struct dte_buffer *buf;

	buf = kzalloc(sizeof(*buf), GFP_KERNEL);
	if (!buf)
		return NULL;
	INIT_LIST_HEAD(&buf->node);
	INIT_LIST_HEAD(&buf->retired);
	buf->iomem = iomem;
	buf->npages = npages;
	buf->backing = dte_alloc_backing(npages);
	if (!buf->backing) {
		dte_free(buf);
		return NULL;
	}
	return buf;
}

/*
 * Moves a movable buffer to new pages, as a driver evicting it would:
 * refused with -EBUSY while an attachment has it pinned; otherwise the
 * contents are copied, the importers told (move_notify), and the old pages
 * kept until release. User mappings made before keep the old pages.
 */
static long dte_move(int fd)
{
	struct dte_backing *next;
	struct dte_buffer *buf;
	struct dma_buf *dmabuf;
	long err = 0;

	dmabuf = dma_buf_get(fd);
	if (IS_ERR(dmabuf))
		return PTR_ERR(dmabuf);
	if (dmabuf->ops != &dte_movable_ops) {
		err = -EINVAL;
		goto out;
	}
	buf = dmabuf->priv;
	next = dte_alloc_backing(buf->npages);
	if (!next) {
		err = -ENOMEM;
		goto out;
	}
	dma_resv_lock(dmabuf->resv, NULL);
	if (dte_held(buf, DTE_PIN)) {
		dma_resv_unlock(dmabuf->resv);
		dte_free_backing(next, buf->npages);
		err = -EBUSY;
		goto out;
	}
	memcpy(next->vaddr, buf->backing->vaddr, buf->npages << PAGE_SHIFT);
	list_add(&buf->backing->node, &buf->retired);
	buf->backing = next;
	atomic_inc(&buf->count[DTE_MOVE]);
	dma_buf_move_notify(dmabuf);
	dma_resv_unlock(dmabuf->resv);
out:
	dma_buf_put(dmabuf);
	return err;
}

static int dte_buffers_show(struct seq_file *s, void *unused)
{
	struct dte_buffer *buf;
	int i;

	mutex_lock(&dte_buffers_lock);
	list_for_each_entry(buf, &dte_buffers, node) {
		seq_printf(s, "%lu", buf->ino);
		for (i = 0; i < DTE_COUNTERS; i++)
			seq_printf(s, " %s=%d", dte_counter_names[i],
				   atomic_read(&buf->count[i]));
		seq_putc(s, '\n');
	}
	mutex_unlock(&dte_buffers_lock);
	seq_printf(s, "unbalanced=%d\n", atomic_read(&dte_unbalanced));
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(dte_buffers);

static long dte_create(struct dte_create __user *arg)
{
	DEFINE_DMA_BUF_EXPORT_INFO(exp_info);
	struct dma_buf *dmabuf;
	struct dte_buffer *buf;
	struct dte_create req;
	int fd;

	if (copy_from_user(&req, arg, sizeof(req)))
		return -EFAULT;
	if (!req.size || req.size > DTE_MAX_SIZE ||
	    req.flags & ~(DTE_IOMEM | DTE_MOVABLE))
		return -EINVAL;

	buf = dte_alloc(PAGE_ALIGN(req.size) >> PAGE_SHIFT,
			req.flags & DTE_IOMEM);
	if (!buf)
		return -ENOMEM;

	if (req.flags & DTE_MOVABLE) {
		exp_info.exp_name = buf->iomem ? "test_exporter_movable_iomem" :
						 "test_exporter_movable";
		exp_info.ops = &dte_movable_ops;
	} else {
		exp_info.exp_name = buf->iomem ? "test_exporter_iomem" :
						 "test_exporter";
		exp_info.ops = &dte_ops;
	}
	exp_info.size = buf->npages << PAGE_SHIFT;
	exp_info.flags = O_RDWR;
	exp_info.priv = buf;
	dmabuf = dma_buf_export(&exp_info);
	if (IS_ERR(dmabuf)) {
		dte_free(buf);
		return PTR_ERR(dmabuf);
	}
	buf->ino = file_inode(dmabuf->file)->i_ino;
	mutex_lock(&dte_buffers_lock);
	list_add_tail(&buf->node, &dte_buffers);
	mutex_unlock(&dte_buffers_lock);

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
	switch (cmd) {
	case DTE_IOCTL_CREATE:
		return dte_create((struct dte_create __user *)arg);
	case DTE_IOCTL_MOVE:
		return dte_move((int)arg);
	default:
		return -ENOTTY;
	}
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

static int __init dte_init(void)
{
	int err = misc_register(&dte_misc);

	if (err)
		return err;
	dte_debugfs = debugfs_create_dir("dmabuf_test_exporter", NULL);
	debugfs_create_file("buffers", 0444, dte_debugfs, NULL,
			    &dte_buffers_fops);
	return 0;
}

static void __exit dte_exit(void)
{
	debugfs_remove_recursive(dte_debugfs);
	misc_deregister(&dte_misc);
}

module_init(dte_init);
module_exit(dte_exit);

MODULE_DESCRIPTION("dma-buf exporter with poisoned sg_table pages, for testing importers");
MODULE_LICENSE("GPL");
