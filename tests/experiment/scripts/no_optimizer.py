print("hello, I train nothing")
